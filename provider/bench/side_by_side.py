"""Side by side: transformers + PEFT against cx-provider on the same model and adapters (CPU).

Generates a Llama checkpoint and PEFT adapters with `cx-provider gen-model` / `gen-adapters`
(Hugging Face files both sides read), then decodes greedily with each:

  (a) distinct adapters in one batch  — PEFT's mixed-adapter `generate(adapter_names=...)`;
      cx-provider: concurrent requests, one adapter each (its scheduler batches them)
  (b) the same batch with no adapter
  (c) the adapted sequences one at a time

and prints tokens/s for each, the cx/HF ratios, each side's peak RSS, and how many sequences
agree token for token (greedy, up to and including the first EOS). Tokens/s counts generated
tokens over wall time, prefill included (prompts are short, so decode dominates). Not part of
CI: torch is large. Run it from the repository root:

    python3 -m venv /tmp/sbs && /tmp/sbs/bin/pip install -r provider/bench/requirements.txt
    cargo build --release -p cx-provider
    /tmp/sbs/bin/python provider/bench/side_by_side.py --threads 2

Both sides get the same thread count (`torch.set_num_threads`, `serve --threads`).
"""

import argparse
import concurrent.futures
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import torch
from peft import PeftModel
from transformers import LlamaForCausalLM

BOS, EOS = 256, 257  # the byte tokenizer of generated models


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompts(count, length):
    """Equal-length prompts (no padding, so both sides see exactly the same input)."""
    out = []
    for i in range(count):
        text = f"prompt {i:02d}: the quick brown fox jumps over the lazy dog"
        ids = [BOS] + list(text.encode())[: length - 1]
        out.append(ids)
    return out


def until_eos(tokens):
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


def post(port, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def cx_generate(port, model, prompt, new_tokens):
    answer = post(port, {"model": model, "prompt": prompt, "max_tokens": new_tokens,
                         "temperature": 0})
    return answer["choices"][0]["token_ids"]


def cx_side(binary, model_dir, adapters_dir, names, batch, new_tokens, threads):
    port = free_port()
    server = subprocess.Popen(
        [binary, "serve", "--model", model_dir, "--adapters", adapters_dir, "--port", str(port),
         "--threads", str(threads), "--served-model-name", "base"],
        stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        # Warm up every adapter (loads on first use), as HF's are loaded before timing.
        for name in names:
            cx_generate(port, name, batch[0], 1)
        figures = {}
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            for case, models in [("mixed", names), ("base", ["base"] * len(batch))]:
                t = time.perf_counter()
                outs = list(pool.map(lambda a: cx_generate(port, a[0], a[1], new_tokens),
                                     zip(models, batch)))
                seconds = time.perf_counter() - t
                figures[case] = (sum(len(o) for o in outs) / seconds, outs)
        t = time.perf_counter()
        outs = [cx_generate(port, name, p, new_tokens) for name, p in zip(names, batch)]
        seconds = time.perf_counter() - t
        figures["sequential"] = (sum(len(o) for o in outs) / seconds, outs)
        with open(f"/proc/{server.pid}/status") as status:
            rss_kb = next(int(l.split()[1]) for l in status if l.startswith("VmHWM:"))
        return figures, rss_kb
    finally:
        server.terminate()
        server.wait()


def hf_side(model_dir, adapter_dirs, names, batch, new_tokens, threads):
    torch.set_num_threads(threads)
    base = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model = PeftModel.from_pretrained(base, adapter_dirs[0], adapter_name=names[0])
    for name, path in zip(names[1:], adapter_dirs[1:]):
        model.load_adapter(path, adapter_name=name)
    model.eval()
    ids = torch.tensor(batch)
    mask = torch.ones_like(ids)

    def generate(adapter_names, input_ids, attention_mask):
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                 adapter_names=adapter_names, max_new_tokens=new_tokens,
                                 do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
        return [until_eos(row[input_ids.shape[1]:].tolist()) for row in out]

    generate(names, ids, mask)  # warm-up
    figures = {}
    for case, adapter_names in [("mixed", names), ("base", ["__base__"] * len(batch))]:
        t = time.perf_counter()
        outs = generate(adapter_names, ids, mask)
        seconds = time.perf_counter() - t
        figures[case] = (sum(len(o) for o in outs) / seconds, outs)
    t = time.perf_counter()
    outs = [generate([n], ids[i : i + 1], mask[i : i + 1])[0] for i, n in enumerate(names)]
    seconds = time.perf_counter() - t
    figures["sequential"] = (sum(len(o) for o in outs) / seconds, outs)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return figures, rss_kb


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default="target/release/cx-provider")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="cx-side-by-side-")
    try:
        model_dir, adapters_dir = os.path.join(work, "model"), os.path.join(work, "adapters")
        run([args.binary, "gen-model", "--out", model_dir, "--hidden", str(args.hidden),
             "--layers", str(args.layers), "--heads", "8", "--kv-heads", "4",
             "--intermediate", str(args.hidden * 11 // 4), "--vocab", "512", "--seed", "1"])
        run([args.binary, "gen-adapters", "--model", model_dir, "--out", adapters_dir,
             "--count", str(args.batch), "--ranks", "8,16", "--seed", "2"])
        names = sorted(os.listdir(adapters_dir))
        adapter_dirs = [os.path.join(adapters_dir, n) for n in names]
        batch = prompts(args.batch, 24)

        cx, cx_rss = cx_side(args.binary, model_dir, adapters_dir, names, batch,
                             args.new_tokens, args.threads)
        hf, hf_rss = hf_side(model_dir, adapter_dirs, names, batch, args.new_tokens,
                             args.threads)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report = {"threads": args.threads, "batch": args.batch, "new_tokens": args.new_tokens,
              "hidden": args.hidden, "layers": args.layers,
              "torch": torch.__version__, "cx_peak_rss_mb": cx_rss / 1024,
              "hf_peak_rss_mb": hf_rss / 1024}
    print(f"{'case':<12}{'cx tok/s':>12}{'hf tok/s':>12}{'cx/hf':>8}{'agree':>8}")
    for case in ["mixed", "base", "sequential"]:
        (cx_rate, cx_out), (hf_rate, hf_out) = cx[case], hf[case]
        agree = sum(until_eos(a) == b for a, b in zip(cx_out, hf_out))
        print(f"{case:<12}{cx_rate:>12.1f}{hf_rate:>12.1f}{cx_rate / hf_rate:>8.2f}"
              f"{agree:>5}/{len(cx_out)}")
        report[case] = {"cx_tokens_per_s": cx_rate, "hf_tokens_per_s": hf_rate,
                        "ratio": cx_rate / hf_rate, "greedy_agree": agree,
                        "sequences": len(cx_out)}
    print(f"peak RSS: cx-provider {cx_rss / 1024:.0f} MB, transformers+PEFT "
          f"{hf_rss / 1024:.0f} MB")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
