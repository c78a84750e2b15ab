#!/usr/bin/env python3
"""Fetch benchmark: cubist against curl, aria2c and sha256sum on a FlashInfer-shaped set.

With --warm-sets N[,N...] it instead times warm fetches (every artifact already cached) of
large sets in the shape of FlashInfer's trtllm-gen FMHA pin (13,453 files): see warm_sets().

Generates 1,000 files with log-normal sizes around 200-300 KB (about 290 MB), serves
them with nginx on loopback, and times in one run, median of --runs each:
  cold `cubist fetch` (fresh cache)  vs  `curl --parallel --parallel-max 16` + `sha256sum -c`
                                     vs  `aria2c -j16` + `sha256sum -c`
  warm `cubist fetch` (all cached)
  `cubist verify --deep`             vs  `sha256sum -c`
  the floor: OpenSSL SHA-256 (Python's hashlib) of the same bytes on all cores.
Prints a Markdown table. Standard library only.
"""
import argparse, hashlib, math, os, random, shutil, statistics, subprocess, sys, tempfile, time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def timed(fn, runs, setup=None):
    times = []
    for _ in range(runs):
        if setup:
            setup()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubist", default=os.path.join(ROOT, "build/cli/cubist"))
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--settle", type=float, default=1.0, help="seconds to settle the disk between runs (untimed)")
    ap.add_argument("--warm-sets", default=None,
                    help="comma-separated file counts (e.g. 13453,23000): time warm fetches of "
                         "sets that large instead of the cold benchmark")
    ap.add_argument("--baseline", default=None,
                    help="with --warm-sets: another cubist binary (e.g. main's) timed side by side")
    args = ap.parse_args()
    if args.warm_sets:
        return warm_sets(args)

    work = args.workdir or tempfile.mkdtemp(prefix="cubist-bench.")
    repo = os.path.join(work, "repo")
    rng = random.Random(1234)
    files = []
    for i in range(args.files):
        # log-normal, median 250 KB, like FlashInfer's batched-GEMM cubins (90-300 KB)
        size = int(min(2_000_000, max(20_000, rng.lognormvariate(math.log(250_000), 0.35))))
        rel = f"cubins/sm_90a/bmm_{i:04d}.cubin"
        path = os.path.join(repo, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rng.randbytes(size))
        files.append(rel)
    total = sum(os.path.getsize(os.path.join(repo, r)) for r in files)
    manifest = os.path.join(work, "manifest.json")
    run([args.cubist, "manifest", "build", repo, "--name", "bench", "--version", "1", "-o", manifest])
    shutil.copy(manifest, os.path.join(repo, "manifest.json"))
    sums = os.path.join(work, "checksums.sha256")
    with open(sums, "w") as out:
        for rel in files:
            with open(os.path.join(repo, rel), "rb") as f:
                out.write(f"{hashlib.sha256(f.read()).hexdigest()}  {rel}\n")

    url = subprocess.run([os.path.join(ROOT, "scripts/serve-nginx"), repo, os.path.join(work, "nginx")],
                         check=True, capture_output=True, text=True).stdout.strip()
    rows = []
    try:
        cache = os.path.join(work, "cache")
        dl = os.path.join(work, "dl")

        def fresh(d):
            # Untimed: remove the last run's files and let the disk settle (this disk is
            # mounted with `discard`; a large delete otherwise bleeds into the next run).
            def f():
                shutil.rmtree(d, ignore_errors=True)
                os.makedirs(d, exist_ok=True)
                os.sync()
                time.sleep(args.settle)
            return f

        def cubist_cold():
            run([args.cubist, "fetch", "-q", "--manifest", url + "manifest.json", "--cache", cache, "-j", str(args.jobs)])

        def cubist_nofsync():
            run([args.cubist, "fetch", "-q", "--no-fsync", "--manifest", url + "manifest.json",
                 "--cache", cache, "-j", str(args.jobs)])

        shm_cache = tempfile.mkdtemp(prefix="cubist-bench-cache.", dir="/dev/shm") if os.path.isdir("/dev/shm") else None

        def cubist_shm():
            run([args.cubist, "fetch", "-q", "--manifest", url + "manifest.json", "--cache", shm_cache,
                 "-j", str(args.jobs)])

        curl_cfg = os.path.join(work, "curl.cfg")
        with open(curl_cfg, "w") as f:
            for rel in files:
                f.write(f'url = "{url}{rel}"\noutput = "{dl}/{rel}"\n')

        def curl_pipeline():
            run(["curl", "-sS", "--fail", "--parallel", "--parallel-max", "16", "--create-dirs", "-K", curl_cfg])
            run(["sha256sum", "--quiet", "-c", sums], cwd=dl)

        aria_list = os.path.join(work, "aria2.txt")
        with open(aria_list, "w") as f:
            for rel in files:
                f.write(f"{url}{rel}\n  out={rel}\n")

        def aria_pipeline():
            run(["aria2c", "-q", "-j16", "--file-allocation=none", "--allow-overwrite=true",
                 "--auto-file-renaming=false", "-d", dl, "-i", aria_list])
            run(["sha256sum", "--quiet", "-c", sums], cwd=dl)

        # Interleaved: one run of each contender per round, so that the disk's drift over
        # the benchmark (this one slows down as it writes) weighs on all of them alike.
        contenders = [("cold", cubist_cold, cache), ("nofsync", cubist_nofsync, cache),
                      ("curl", curl_pipeline, dl), ("aria", aria_pipeline, dl)]
        if shm_cache:
            contenders.append(("shm", cubist_shm, shm_cache))
        samples = {name: [] for name, _, _ in contenders}
        for _ in range(args.runs):
            for name, fn, d in contenders:
                fresh(d)()
                t = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in samples.items()}
        cold, cold_all, nofsync, curl_t, aria_t = med["cold"], samples["cold"], med["nofsync"], med["curl"], med["aria"]
        shm = med.get("shm")
        if shm_cache:
            shutil.rmtree(shm_cache, ignore_errors=True)

        # Warm: everything cached; the manifest is still read from the server.
        fresh(cache)()
        cubist_cold()
        warm, _ = timed(lambda: run([args.cubist, "fetch", "-q", "--manifest", url + "manifest.json", "--cache", cache]), max(args.runs, 10))
        warm_local, _ = timed(lambda: run([args.cubist, "fetch", "-q", "--manifest", manifest, "--cache", cache]), max(args.runs, 10))

        deep, _ = timed(lambda: run([args.cubist, "verify", "--deep", "--manifest", manifest, "--cache", cache]), args.runs)
        shasum, _ = timed(lambda: run(["sha256sum", "--quiet", "-c", sums], cwd=dl), args.runs)

        blobs = []
        for rel in files:
            with open(os.path.join(repo, rel), "rb") as f:
                blobs.append(f.read())
        cores = os.cpu_count() or 1

        def floor():
            with ThreadPoolExecutor(cores) as ex:
                list(ex.map(lambda b: hashlib.sha256(b).digest(), blobs))

        floor_t, _ = timed(floor, args.runs)
    finally:
        subprocess.run(["kill", open(os.path.join(work, "nginx", "nginx.pid")).read().strip()])

    mb = total / 1e6
    def row(name, t, base=None, note=""):
        ratio = f"{t / base:.2f}x" if base else ""
        rows.append(f"| {name} | {t * 1000:.0f} ms | {mb / t:.0f} MB/s | {ratio} | {note} |")

    print(f"{args.files} files, {mb:.1f} MB, nginx on loopback, {os.cpu_count()} cores, median of {args.runs} interleaved rounds\n")
    for k, v in samples.items():
        print(f"- {k}: {', '.join(f'{t*1000:.0f}' for t in v)} ms")
    print()
    print("| what | wall | rate | ratio | note |\n| --- | --- | --- | --- | --- |")
    row("cold `cubist fetch -j16`", cold, curl_t, "vs the curl pipeline (target <= 0.33x)")
    row("cold `cubist fetch --no-fsync`", nofsync, curl_t, "same, without flushing to disk")
    if shm is not None:
        row("cold `cubist fetch`, cache on tmpfs", shm, curl_t, "network + hashing only, no disk")
    row("`curl --parallel --parallel-max 16` + `sha256sum -c`", curl_t, curl_t, "baseline")
    row("`aria2c -j16` + `sha256sum -c`", aria_t, curl_t, "vs the curl pipeline")
    row("OpenSSL SHA-256 of the same bytes, all cores (floor)", floor_t, None, "")
    rows.append(f"| cold `cubist fetch` / hashing floor | | | {cold / floor_t:.2f}x | target <= 2x |")
    if shm is not None:
        rows.append(f"| cold `cubist fetch` on tmpfs / hashing floor | | | {shm / floor_t:.2f}x | |")
    row("warm `cubist fetch` (URL manifest, all cached)", warm, None, "target < 30 ms")
    row("warm `cubist fetch` (local manifest, all cached)", warm_local, None, "")
    row("`cubist verify --deep`", deep, shasum, "vs `sha256sum -c` (target <= 0.2x)")
    row("`sha256sum -c`", shasum, shasum, "baseline")
    print("\n".join(rows))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


def warm_sets(args):
    """Warm `cubist fetch` of large sets, the binaries side by side.

    Each set is N small files (4-16 KB: the warm path never reads them) under a pin
    directory named like FlashInfer's, with a checksums.txt (sha256 and path, no sizes)
    and a cubist manifest.json (with sizes) beside them, served by nginx on loopback.
    Each binary gets its own cache, filled once; then, interleaved round by round, every
    binary runs `fetch -q` with the manifest as a URL and as a local path, each online and
    with --offline. Prints the median and the spread of the wall time of each, and the
    median CPU time (user + system, from the kernel's accounting of the finished child):
    on a machine shared with other work the wall time follows the load, the CPU time
    much less.
    """
    import json, resource
    counts = [int(c) for c in args.warm_sets.split(",")]
    bins = [("this", args.cubist)] + ([("baseline", args.baseline)] if args.baseline else [])
    runs = max(args.runs, 11)
    work = args.workdir or tempfile.mkdtemp(prefix="cubist-warm.")
    print(f"warm fetch, nginx on loopback, {os.cpu_count()} cores, median of {runs} interleaved rounds")
    for name, path in bins:
        ver = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
        print(f"- {name}: {path} ({ver})")
    print()
    print("| files | manifest | mode | " + " | ".join(n for n, _ in bins) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in bins) + " |")
    for n in counts:
        set_dir = os.path.join(work, f"set-{n}")
        pin = "d2c5915bf45ae64308a947824c14966c2718a292/fmha/trtllm-gen"
        repo = os.path.join(set_dir, "repo")
        root = os.path.join(repo, pin)
        rng = random.Random(n)
        entries = []
        for i in range(n):
            size = rng.randint(4096, 16384)
            # Long names like trtllm-gen's (FmhaSm100aKernel_QkvE4m3OBfloat16H128...).
            rel = (f"FmhaSm100aKernel_Qkv{rng.choice(['E4m3', 'Bfloat16', 'Fp16'])}"
                   f"O{rng.choice(['Bfloat16', 'E4m3', 'E2m1'])}H{rng.choice([64, 128, 256])}"
                   f"Paged{rng.choice(['Kv', 'KvCausal', 'KvSliding'])}P{i:05d}"
                   f"VarSeqQ128Kv128PersistentContext_sm100a.cubin")
            data = rng.randbytes(size)
            p = os.path.join(root, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(data)
            entries.append((hashlib.sha256(data).hexdigest(), rel, size))
        with open(os.path.join(root, "checksums.txt"), "w") as f:
            for h, rel, _ in entries:
                f.write(f"{h} {rel}\n")
        with open(os.path.join(root, "manifest.json"), "w") as f:
            json.dump({"schema": "cubist.manifest/1", "name": f"fmha-{n}", "version": 1,
                       "artifacts": [{"path": rel, "sha256": h, "size": size}
                                     for h, rel, size in entries]}, f, indent=1)
        url = subprocess.run([os.path.join(ROOT, "scripts/serve-nginx"), repo,
                              os.path.join(set_dir, "nginx")],
                             check=True, capture_output=True, text=True).stdout.strip()
        try:
            cases = []
            for kind in ("checksums.txt", "manifest.json"):
                for where in ("URL", "path"):
                    loc = (url + pin + "/" + kind) if where == "URL" else os.path.join(root, kind)
                    for offline in (False, True):
                        cases.append((kind, where, offline, loc))
            caches = {}
            for name, path in bins:
                caches[name] = os.path.join(set_dir, f"cache-{name}")
                shutil.rmtree(caches[name], ignore_errors=True)
                # Fill the cache, and let each manifest be read online once (an URL
                # manifest is remembered for --offline at its first online read).
                for kind in ("checksums.txt", "manifest.json"):
                    run([path, "fetch", "-q", "--no-fsync", "--manifest", url + pin + "/" + kind,
                         "--cache", caches[name]])
            samples = {(c[:3], b): [] for c in cases for b, _ in bins}
            cpu = {(c[:3], b): [] for c in cases for b, _ in bins}
            for _ in range(runs):
                for kind, where, offline, loc in cases:
                    for name, path in bins:
                        cmd = [path, "fetch", "-q", "--manifest", loc, "--cache", caches[name]]
                        if offline:
                            cmd.append("--offline")
                        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                        t = time.perf_counter()
                        run(cmd)
                        samples[((kind, where, offline), name)].append(time.perf_counter() - t)
                        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                        cpu[((kind, where, offline), name)].append(
                            (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
            for kind, where, offline, _ in cases:
                cells = []
                for name, _ in bins:
                    v = sorted(samples[((kind, where, offline), name)])
                    c = statistics.median(cpu[((kind, where, offline), name)])
                    cells.append(f"{statistics.median(v) * 1000:.0f} ms ({v[0] * 1000:.0f}-{v[-1] * 1000:.0f}), "
                                 f"CPU {c * 1000:.0f} ms")
                mode = "--offline" if offline else "online"
                print(f"| {n:,} | {kind} by {where} | {mode} | " + " | ".join(cells) + " |", flush=True)
        finally:
            subprocess.run(["kill", open(os.path.join(set_dir, "nginx", "nginx.pid")).read().strip()])
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
