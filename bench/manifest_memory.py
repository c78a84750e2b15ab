#!/usr/bin/env python3
"""Memory per manifest entry: peak RSS of `cubist fetch --offline` on a large manifest.

Writes a manifest of --entries artifacts (paths of 19 bytes, every size stated: about
120 bytes of JSON per entry, the density of the 60 MB, 504k-entry manifest this measures) and one of 10 entries, caches one artifact of each, and runs
`cubist fetch --offline --filter <that artifact>` on both: the whole manifest is read,
checked and parsed, and one object is looked at. The difference of the two peak RSS
(from wait4) divided by the difference in entries is the memory per entry. Each size is
run twice: the first run parses the JSON, the second finds the parse in the cache's
parsed-manifest store (a warm fetch). Prints a Markdown table. Standard library only.

  bench/manifest_memory.py [--entries 504000] [--cubist build/cli/cubist]
"""
import argparse, hashlib, json, os, shutil, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_set(directory, entries):
    """A manifest of `entries` artifacts; only the first one's file exists."""
    os.makedirs(directory, exist_ok=True)
    first = b"the one artifact this run fetches"
    artifacts = []
    for i in range(entries):
        path = f"fmha/k{i:07d}.cubin"
        data = first if i == 0 else str(i).encode()
        artifacts.append({"path": path, "sha256": hashlib.sha256(data).hexdigest(),
                          "size": len(data)})
    os.makedirs(os.path.join(directory, os.path.dirname(artifacts[0]["path"])), exist_ok=True)
    with open(os.path.join(directory, artifacts[0]["path"]), "wb") as f:
        f.write(first)
    manifest = {"schema": "cubist.manifest/1", "name": f"mem{entries}", "version": 1,
                "artifacts": artifacts}
    path = os.path.join(directory, "manifest.json")
    with open(path, "w") as f:
        json.dump(manifest, f)
    return path, artifacts[0]["path"]


def peak_rss_kib(cmd):
    pid = os.spawnv(os.P_NOWAIT, cmd[0], cmd)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed ({os.waitstatus_to_exitcode(status)})")
    return usage.ru_maxrss


def measure(cubist, work, entries):
    manifest, first = write_set(os.path.join(work, f"set{entries}"), entries)
    cache = os.path.join(work, f"cache{entries}")
    # Online once to cache the one artifact (a file:// source, no network).
    subprocess.run([cubist, "fetch", "-q", "--manifest", manifest, "--cache", cache,
                    "--filter", first], check=True)
    cmd = [cubist, "fetch", "-q", "--offline", "--manifest", manifest, "--cache", cache,
           "--filter", first]
    shutil.rmtree(os.path.join(cache, "manifests", "parsed"), ignore_errors=True)
    cold = peak_rss_kib(cmd)
    warm = peak_rss_kib(cmd)
    return os.path.getsize(manifest), cold, warm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubist", default=os.path.join(ROOT, "build/cli/cubist"))
    ap.add_argument("--entries", type=int, default=504000)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="cubist-mem.")
    small = measure(args.cubist, work, 10)
    large = measure(args.cubist, work, args.entries)
    n = args.entries - 10
    print(f"| manifest | entries | peak RSS, parse | per entry | peak RSS, cached parse | per entry |")
    print(f"|---|---:|---:|---:|---:|---:|")
    for entries, (size, cold, warm) in ((10, small), (args.entries, large)):
        per_cold = (cold - small[1]) * 1024 / n if entries != 10 else 0
        per_warm = (warm - small[2]) * 1024 / n if entries != 10 else 0
        print(f"| {size / 1e6:.1f} MB | {entries} | {cold / 1024:.0f} MiB | {per_cold:.0f} B | "
              f"{warm / 1024:.0f} MiB | {per_warm:.0f} B |")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
