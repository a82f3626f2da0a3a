"""Side by side: llama.cpp's llama-server against cx-provider serve, HTTP against HTTP (CPU).

Builds llama.cpp from the source that llama-cpp-python's PyPI package vendors (with cmake,
CPU only, Release, no curl) into .tools/llama/, generates a Llama checkpoint and 8 PEFT
adapters with `cx-provider gen-model` / `gen-adapters`, converts them with llama.cpp's own
`convert_hf_to_gguf.py` and `convert_lora_to_gguf.py` (f32), starts both servers with the same
thread count, and decodes greedily through each:

  one request at a time, no adapter          8 at once, no adapter
  one at a time, each its own adapter        8 at once, one shared adapter
  8 at once, 8 different adapters

It prints decode tokens/s per side (generated tokens over wall time, medians of alternating
rounds: cx, llama, cx, llama, ...), the cx/llama ratio, greedy agreement (token for token, per
request, up to the first EOS) and each server's peak RSS (VmHWM). Prompts are sent as token
ids (BOS + bytes), so both servers see the same input whatever their tokenizers make of text.

llama-server's `-np 8` batches only requests with equal adapter sets; each request names every
adapter's scale explicitly (1 for its own, 0 for the others): an empty `lora` list means "the
server's defaults", which may apply every loaded adapter.

Idempotent setup (rerun freely; nothing is rebuilt that is already there):

    cargo build --release -p cx-provider
    python3 provider/bench/llama_cpp.py --threads 2            # sets up .tools/llama first
    python3 provider/bench/llama_cpp.py --setup-only           # just venv + llama-server

Not part of CI: torch (for the converters) and the llama.cpp build are large.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, ".tools", "llama")
VENV = os.path.join(TOOLS, "venv")
PYTHON = os.path.join(VENV, "bin", "python")
REQUIREMENTS = os.path.join(ROOT, "provider", "bench", "llama_cpp_requirements.txt")
BOS, EOS = 256, 257  # the byte tokenizer of generated models


def log(message):
    print(message, file=sys.stderr, flush=True)


def run(cmd, **kwargs):
    subprocess.run(cmd, check=True, **kwargs)


def pinned(name):
    with open(REQUIREMENTS) as f:
        for line in f:
            if line.startswith(name + "=="):
                return line.strip().split("==")[1]
    raise SystemExit(f"{REQUIREMENTS} pins no {name}")


BUILD_PACKAGES = ("cmake", "ninja", "scikit-build-core")
TARGETS = ("llama-server", "llama-quantize", "llama-perplexity")


def setup(jobs, converters=True):
    """The venv (with the converters' dependencies when `converters`: torch is large),
    llama.cpp's source, and its tools: llama-server, llama-quantize, llama-perplexity."""
    os.makedirs(TOOLS, exist_ok=True)
    if not os.path.exists(PYTHON):
        log("setup: venv")
        run([sys.executable, "-m", "venv", VENV])
    with open(REQUIREMENTS, "rb") as f:
        wanted = hashlib.sha256(f.read()).hexdigest()
    packages = [line.strip() for line in open(REQUIREMENTS)
                if line.strip() and not line.startswith("#")
                and not line.startswith("llama-cpp-python")]
    build_stamp = os.path.join(VENV, ".build-requirements-sha256")
    if not os.path.exists(build_stamp) or open(build_stamp).read() != wanted:
        log("setup: pip install the build tools")
        run([PYTHON, "-m", "pip", "install", "-q",
             *[p for p in packages if p.split("=")[0].split("~")[0] in BUILD_PACKAGES]])
        with open(build_stamp, "w") as f:
            f.write(wanted)
    stamp = os.path.join(VENV, ".requirements-sha256")
    if converters and (not os.path.exists(stamp) or open(stamp).read() != wanted):
        log("setup: pip install (torch is large)")
        run([PYTHON, "-m", "pip", "install", "-q", *packages])
        with open(stamp, "w") as f:
            f.write(wanted)
    version = pinned("llama-cpp-python")
    src = os.path.join(TOOLS, "src", f"llama_cpp_python-{version}")
    llama = os.path.join(src, "vendor", "llama.cpp")
    if not os.path.exists(os.path.join(llama, "CMakeLists.txt")):
        sdist = os.path.join(TOOLS, "sdist")
        log(f"setup: llama-cpp-python {version} source package (vendors llama.cpp)")
        # --no-build-isolation: metadata from the venv's scikit-build-core, instead of
        # building cmake from source for an isolated build environment.
        run([PYTHON, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation",
             "--no-binary", "llama-cpp-python", f"llama-cpp-python=={version}", "-d", sdist])
        os.makedirs(os.path.dirname(src), exist_ok=True)
        run(["tar", "-xzf", os.path.join(sdist, f"llama_cpp_python-{version}.tar.gz"),
             "-C", os.path.dirname(src)])
    build = os.path.join(TOOLS, "build")
    cmake = os.path.join(VENV, "bin", "cmake")
    if not os.path.exists(os.path.join(build, "build.ninja")):
        run([cmake, "-S", llama, "-B", build, "-G", "Ninja",
             f"-DCMAKE_MAKE_PROGRAM={os.path.join(VENV, 'bin', 'ninja')}",
             "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
             "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF",
             "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON"], stdout=subprocess.DEVNULL)
    missing = [t for t in TARGETS if not os.path.exists(os.path.join(build, "bin", t))]
    if missing:
        log(f"setup: building {', '.join(missing)} (cmake, Release, CPU, -j{jobs})")
        run([cmake, "--build", build, "--target", *missing, "-j", str(jobs)])
    return llama, os.path.join(build, "bin", "llama-server")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def wait_healthy(port, process, what):
    for _ in range(1200):
        if process.poll() is not None:
            raise SystemExit(f"{what} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not become healthy")


def peak_rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmHWM:")) / 1024


def until_eos(tokens):
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


class Cx:
    name = "cx"

    def __init__(self, binary, model_dir, adapters_dir, threads, extra):
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, "serve", "--model", model_dir, "--adapters", adapters_dir,
             "--port", str(self.port), "--threads", str(threads),
             "--served-model-name", "base", *extra], stderr=subprocess.DEVNULL)
        wait_healthy(self.port, self.process, "cx-provider serve")

    def generate(self, adapter, prompt, new_tokens):
        answer = post(self.port, "/v1/completions", {
            "model": "base" if adapter is None else adapter, "prompt": prompt,
            "max_tokens": new_tokens, "temperature": 0})
        return until_eos(answer["choices"][0]["token_ids"])


class Llama:
    name = "llama"

    def __init__(self, server, gguf, lora_ggufs, names, threads, slots, context):
        self.port = free_port()
        self.names = names
        cmd = [server, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(threads), "-np", str(slots),
               "-c", str(slots * context), "-ctk", "f32", "-ctv", "f32",
               "--lora-init-without-apply", "--no-webui"]
        for path in lora_ggufs:
            cmd += ["--lora", path]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        wait_healthy(self.port, self.process, "llama-server")

    def generate(self, adapter, prompt, new_tokens):
        lora = [{"id": i, "scale": 1.0 if name == adapter else 0.0}
                for i, name in enumerate(self.names)]
        answer = post(self.port, "/completion", {
            "prompt": prompt, "n_predict": new_tokens, "temperature": 0, "top_k": 1,
            "cache_prompt": False, "return_tokens": True, "lora": lora})
        return until_eos(answer["tokens"])


def prompts(count, length):
    out = []
    for i in range(count):
        text = f"prompt {i:02d}: the quick brown fox jumps over the lazy dog"
        out.append([BOS] + list(text.encode())[: length - 1])
    return out


CASES = [
    ("one request at a time, no adapter", "single", "none"),
    ("8 at once, no adapter", "batch", "none"),
    ("one at a time, each its own adapter", "single", "own"),
    ("8 at once, one shared adapter", "batch", "shared"),
    ("8 at once, 8 different adapters", "batch", "own"),
]


def run_case(side, shape, adapters, names, batch, new_tokens, pool):
    if adapters == "none":
        chosen = [None] * len(batch)
    elif adapters == "shared":
        chosen = [names[0]] * len(batch)
    else:
        chosen = names[: len(batch)]
    t = time.perf_counter()
    if shape == "single":
        outs = [side.generate(a, p, new_tokens) for a, p in zip(chosen, batch)]
    else:
        outs = list(pool.map(lambda ap: side.generate(ap[0], ap[1], new_tokens),
                             zip(chosen, batch)))
    seconds = time.perf_counter() - t
    return sum(len(o) for o in outs) / seconds, outs


def measure(args, llama_dir, server, binary, hidden, layers, work):
    model_dir = os.path.join(work, f"model-{hidden}x{layers}")
    adapters_dir = os.path.join(work, f"adapters-{hidden}x{layers}")
    run([binary, "gen-model", "--out", model_dir, "--hidden", str(hidden), "--layers",
         str(layers), "--heads", "8", "--kv-heads", "4", "--intermediate", str(hidden * 11 // 4),
         "--vocab", "512", "--seed", "1"], stdout=subprocess.DEVNULL)
    run([binary, "gen-adapters", "--model", model_dir, "--out", adapters_dir, "--count",
         str(args.batch), "--ranks", "8,16", "--seed", "2"], stdout=subprocess.DEVNULL)
    names = sorted(os.listdir(adapters_dir))
    env = dict(os.environ, PYTHONPATH=os.path.join(llama_dir, "gguf-py"))
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    gguf = os.path.join(work, f"model-{hidden}x{layers}.gguf")
    log(f"{hidden}x{layers}: converting with convert_hf_to_gguf.py / convert_lora_to_gguf.py")
    run([PYTHON, os.path.join(llama_dir, "convert_hf_to_gguf.py"), model_dir, "--outtype",
         "f32", "--outfile", gguf], **quiet)
    lora_ggufs = []
    for name in names:
        out = os.path.join(work, f"{name}-{hidden}x{layers}.gguf")
        run([PYTHON, os.path.join(llama_dir, "convert_lora_to_gguf.py"),
             os.path.join(adapters_dir, name), "--base", model_dir, "--outtype", "f32",
             "--outfile", out], **quiet)
        lora_ggufs.append(out)
    batch = prompts(args.batch, 24)
    context = 24 + args.new_tokens + 8
    sides = [Cx(binary, model_dir, adapters_dir, args.threads, args.cx_arg),
             Llama(server, gguf, lora_ggufs, names, args.threads, args.batch, context)]
    rates = {(s.name, c[0]): [] for s in sides for c in CASES}
    outputs = {}
    try:
        with concurrent.futures.ThreadPoolExecutor(args.batch) as pool:
            for side in sides:  # warm-up: every adapter once, both shapes
                for name in names:
                    side.generate(name, batch[0], 2)
                run_case(side, "batch", "none", names, batch, 4, pool)
            for round_ in range(args.rounds):
                order = sides if round_ % 2 == 0 else sides[::-1]
                for label, shape, adapters in CASES:
                    for side in order:
                        rate, outs = run_case(side, shape, adapters, names, batch,
                                              args.new_tokens, pool)
                        rates[(side.name, label)].append(rate)
                        outputs[(side.name, label)] = outs
                log(f"{hidden}x{layers}: round {round_ + 1}/{args.rounds} done")
        rss = {s.name: peak_rss_mb(s.process.pid) for s in sides}
    finally:
        for side in sides:
            side.process.terminate()
            side.process.wait()
    rows = []
    for label, _, _ in CASES:
        cx_rate = statistics.median(rates[("cx", label)])
        llama_rate = statistics.median(rates[("llama", label)])
        agree = sum(a == b for a, b in zip(outputs[("cx", label)], outputs[("llama", label)]))
        rows.append({"case": label, "cx_tokens_per_s": cx_rate,
                     "llama_tokens_per_s": llama_rate, "ratio": cx_rate / llama_rate,
                     "greedy_agree": agree, "sequences": len(batch),
                     "cx_rounds": rates[("cx", label)],
                     "llama_rounds": rates[("llama", label)]})
    return {"hidden": hidden, "layers": layers, "rows": rows,
            "cx_peak_rss_mb": rss["cx"], "llama_peak_rss_mb": rss["llama"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default=os.path.join(ROOT, "target/release/cx-provider"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="512x4,2048x2",
                        help="hidden x layers, comma separated")
    parser.add_argument("--jobs", type=int, default=2, help="llama.cpp build jobs")
    parser.add_argument("--cx-arg", action="append", default=[],
                        help="extra argument for cx-provider serve (repeatable)")
    parser.add_argument("--setup-only", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    llama_dir, server = setup(args.jobs)
    if args.setup_only:
        print(server)
        return
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="cx-llama-cpp-")
    try:
        results = [measure(args, llama_dir, server, args.binary, h, l, work) for h, l in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    head = "| decode tok/s, cx / llama-server |" + "".join(
        f" hidden {r['hidden']}, {r['layers']} layers |" for r in results)
    print(head)
    print("|---|" + "---|" * len(results))
    for i, (label, _, _) in enumerate(CASES):
        cells = []
        for r in results:
            row = r["rows"][i]
            cells.append(f" {row['ratio']:.2f}× ({row['cx_tokens_per_s']:.1f} / "
                         f"{row['llama_tokens_per_s']:.1f}, agree {row['greedy_agree']}/"
                         f"{row['sequences']}) |")
        print(f"| {label} |" + "".join(cells))
    for r in results:
        print(f"peak RSS at hidden {r['hidden']}: cx-provider {r['cx_peak_rss_mb']:.0f} MB, "
              f"llama-server {r['llama_peak_rss_mb']:.0f} MB")
    if args.json:
        print(json.dumps({"threads": args.threads, "batch": args.batch,
                          "new_tokens": args.new_tokens, "rounds": args.rounds,
                          "cx_args": args.cx_arg, "results": results}))


if __name__ == "__main__":
    main()
