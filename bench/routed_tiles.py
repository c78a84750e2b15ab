#!/usr/bin/env python3
"""The tile the cost model picks for a MoE layer's GEMMs, priced for the router's spread of
rows against priced as if spread evenly, both timed on the routed rows (GPU).

    python3 bench/routed_tiles.py --cubist BUILD/cli/cubist --manifest ART/manifest.json \\
        [--models qwen3,gptoss,deepseek,mixtral] [--tokens 64,256,1024,4096] \\
        [--pairs bf16,fp8,mxfp4,nvfp4] [--all] [--csv out.csv] [--timings out.jsonl]

For each model, batch size T and weight pair, the layer's two GEMM problems (GEMM1 SwiGLU
H -> 2I, GEMM2 I -> H, on the row bucket: the power of two >= T x k rows, as MoeLayer
poses them): `cubist select` gives the choice with the rows routed (--routed-top-k k, what
the layer asks for) and spread evenly (what MoeGemm assumes of its callers' offsets).
Where the two differ (every problem with --all), `cubist tune --top 0 --dry-run
--routed-top-k k` times every candidate on one fixed draw of that routing (L2 flushed,
medians), and the row says each choice's time over the fastest. `--timings` keeps every
candidate's time, one JSON line per timed problem written as it is timed (the data a
calibration of the cost model is fitted on). No GPU is needed for the select step:
`--select-only` prints where the choices differ.
"""
import argparse
import csv
import json
import os
import subprocess
import sys

# The layers of docs/benchmarks.md's tables: experts, top-k, hidden H, intermediate I.
MODELS = {"qwen3": (128, 8, 2048, 768), "gptoss": (128, 4, 2880, 2880),
          "deepseek": (256, 8, 7168, 2048), "mixtral": (8, 2, 4096, 14336)}
PAIRS = {"bf16": ("bf16", "bf16"), "fp8": ("fp8", "fp8"), "fp8-block": ("fp8-block", "fp8-block"),
         "mxfp4": ("mxfp4", "bf16"), "mxfp4-mxfp8": ("mxfp4", "mxfp8"),
         "nvfp4-bf16": ("nvfp4", "bf16"), "nvfp4": ("nvfp4", "nvfp4")}


def row_bucket(tokens, top_k):
    rows = 1
    while rows < tokens * top_k:
        rows *= 2
    return rows


def run_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stdout}{r.stderr}")
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cubist", required=True, help="the cubist command")
    ap.add_argument("--manifest", required=True, help="manifest.json of the built family")
    ap.add_argument("--models", default="qwen3,gptoss,deepseek,mixtral")
    ap.add_argument("--tokens", default="64,256,1024,4096")
    ap.add_argument("--pairs", default="bf16,fp8,mxfp4,nvfp4")
    ap.add_argument("--all", action="store_true", help="time every problem, not only changed ones")
    ap.add_argument("--select-only", action="store_true", help="no GPU: list where the choices differ")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--csv", help="also write the rows here")
    ap.add_argument("--timings", help="write every timed candidate here (JSON lines)")
    args = ap.parse_args()
    for flag, given, known in (("--models", args.models, MODELS), ("--pairs", args.pairs, PAIRS)):
        bad = [x for x in given.split(",") if x not in known]
        if bad:
            sys.exit(f"routed_tiles: {flag}: unknown {', '.join(bad)}; choose from {','.join(known)}")
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        sys.exit(f"routed_tiles: --tokens {args.tokens!r}: give counts such as 64,4096")
    if not os.access(args.cubist, os.X_OK):
        sys.exit(f"routed_tiles: --cubist {args.cubist}: not an executable; build it (scripts/build)")

    rows_out = []
    timings = open(args.timings, "w") if args.timings else None
    print("| model | T | pair | GEMM | routed choice | even choice | fastest (us) | routed / fastest "
          "| even / fastest |")
    print("| --- | ---: | --- | --- | --- | --- | ---: | ---: | ---: |")
    for model in args.models.split(","):
        e, k, h, i = MODELS[model]
        for t in tokens:
            rows = row_bucket(t, k)
            for pair in args.pairs.split(","):
                w, a = PAIRS[pair]
                for gemm, act, n, kk in (("GEMM1", "swiglu", 2 * i, h), ("GEMM2", "identity", h, i)):
                    problem = ["--manifest", args.manifest, "--weights", w, "--activations", a,
                               "--activation", act, "--experts", str(e), "--tokens", str(rows),
                               "--n", str(n), "--k", str(kk)]
                    routed_flags = ["--routed-top-k", str(k)]
                    sel = [args.cubist, "select", *problem, "--sm", "90a", "--json"]
                    routed = run_json(sel + routed_flags)["kernel"]
                    even = run_json(sel)["kernel"]
                    row = dict(model=model, tokens=t, pair=pair, gemm=gemm, routed=routed,
                               even=even, fastest_us="", routed_ratio="", even_ratio="")
                    if not args.select_only and (args.all or routed != even):
                        tune = run_json([args.cubist, "tune", *problem, *routed_flags, "--top", "0",
                                         "--dry-run", "--json",
                                         "--iterations", str(args.iterations)])
                        times = {c["kernel"]: c["measured_us"] for c in tune["timings"]
                                 if "measured_us" in c}
                        best = min(times.values())
                        if timings:
                            timings.write(json.dumps(dict(
                                model=model, tokens=t, rows=rows, pair=pair, gemm=gemm,
                                experts=e, top_k=k, n=n, k=kk, routed=routed, even=even,
                                times_us=times)) + "\n")
                            timings.flush()
                        row.update(fastest_us=f"{best:.1f}",
                                   routed_ratio=f"{times[routed] / best:.3f}",
                                   even_ratio=f"{times[even] / best:.3f}")
                    if args.all or routed != even:
                        print(f"| {model} | {t} | {pair} | {gemm} | {routed} | {even} | "
                              f"{row['fastest_us']} | {row['routed_ratio']} | {row['even_ratio']} |",
                              flush=True)
                    rows_out.append(row)
    changed = sum(r["routed"] != r["even"] for r in rows_out)
    print(f"\n{changed} of {len(rows_out)} GEMM problems change their tile when priced routed")
    timed = [r for r in rows_out if r["routed_ratio"]]
    if timed:
        within = sum(float(r["routed_ratio"]) <= 1.05 for r in timed)
        better = sum(float(r["routed_ratio"]) < float(r["even_ratio"]) for r in timed)
        print(f"timed {len(timed)}: the routed choice within 5% of the fastest on {within}, "
              f"faster than the even choice on {better}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows_out[0]) if rows_out else ["model"])
            wr.writeheader()
            wr.writerows(rows_out)


if __name__ == "__main__":
    main()
