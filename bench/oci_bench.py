#!/usr/bin/env python3
"""OCI registry benchmark: the 1,000-file set of fetch_bench.py through a real registry.

Starts Debian's docker-registry (distribution 2.8) and nginx on loopback, then times,
median of --runs each, contenders interleaved per round:
  cold `cubist fetch` from the registry (oci://...:v1)   vs  the same from nginx serving
                                                             the files directly (target <= 1.3x)
    three registry configurations over the same storage, each its own process:
      plain     the config of the first measurement (no blob descriptor cache)
      tuned     storage.cache.blobdescriptor: inmemory, GOGC=400 (README "Many nodes")
      redirect  tuned, plus the `redirect` storage middleware pointing at an nginx that
                serves the registry's storage root with sendfile: blob GETs are
                answered with a 307 to it (README "Many nodes")
    and the registry's CPU seconds per fetch (from /proc/PID/stat; for `redirect` also
    the nginx workers' CPU seconds).
  `cubist push` of the set to an empty registry          vs  `skopeo copy` of the same blobs
                                                             from an OCI layout (when skopeo
                                                             is installed: apt-get install skopeo)
The registry's storage is wiped before every push (untimed). Prints a Markdown table.
Standard library only.
"""
import argparse, hashlib, json, math, os, random, shutil, socket, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, **kw):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_seconds(pids):
    """User + system CPU seconds of these processes so far."""
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


class Registry:
    """docker-registry over `storage`, in one of three configurations (see the docstring)."""

    def __init__(self, work, storage=None, variant="plain"):
        self.work = work
        self.storage = storage or os.path.join(work, "storage")
        self.variant = variant
        self.port = free_port()
        self.proc = None
        self.nginx_pid = None

    def start(self, wipe=False):
        storage = self.storage
        if wipe:
            shutil.rmtree(storage, ignore_errors=True)
        os.makedirs(storage, exist_ok=True)
        os.makedirs(self.work, exist_ok=True)
        cache = "  cache:\n    blobdescriptor: inmemory\n" if self.variant != "plain" else ""
        middleware = ""
        if self.variant == "redirect":
            middleware = ("middleware:\n  storage:\n    - name: redirect\n      options:\n"
                          f"        baseurl: http://127.0.0.1:{self.storage_server()}/\n")
        cfg = os.path.join(self.work, "config.yml")
        with open(cfg, "w") as f:
            f.write("version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
                    f"storage:\n  filesystem:\n    rootdirectory: {storage}\n{cache}"
                    "  maintenance:\n    uploadpurging:\n      enabled: false\n"
                    f"{middleware}http:\n  addr: 127.0.0.1:{self.port}\n  secret: bench\n")
        env = dict(os.environ)
        if self.variant != "plain":
            env["GOGC"] = "400"
        self.proc = subprocess.Popen(["docker-registry", "serve", cfg], stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(self.work, "registry.log"), "a"),
                                     env=env)
        for _ in range(500):  # bounded: 5 s
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("docker-registry did not start")

    def storage_server(self):
        """nginx serving the blob data files of the storage root (the README's recipe);
        returns its port."""
        nw = os.path.join(self.work, "blob-nginx")
        if self.nginx_pid is not None:
            return self.nginx_port
        os.makedirs(os.path.join(nw, "tmp"), exist_ok=True)
        self.nginx_port = free_port()
        user = "user root;" if os.geteuid() == 0 else ""
        with open(os.path.join(nw, "nginx.conf"), "w") as f:
            f.write(f"""{user}
worker_processes 2; pid {nw}/nginx.pid; error_log {nw}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off; sendfile on; tcp_nopush on; tcp_nodelay on;
  keepalive_requests 100000;
  client_body_temp_path {nw}/tmp/body; proxy_temp_path {nw}/tmp/proxy;
  fastcgi_temp_path {nw}/tmp/fastcgi; uwsgi_temp_path {nw}/tmp/uwsgi; scgi_temp_path {nw}/tmp/scgi;
  server {{
    listen 127.0.0.1:{self.nginx_port};
    root {self.storage};
    location ~ "^/docker/registry/v2/blobs/sha256/[0-9a-f]{{2}}/[0-9a-f]{{64}}/data$" {{
      default_type application/octet-stream;
    }}
    location / {{ return 404; }}
  }}
}}
""")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        run([nginx, "-p", nw, "-c", os.path.join(nw, "nginx.conf")])
        for _ in range(500):  # bounded: 5 s for the daemon to write its pid file
            try:
                with open(os.path.join(nw, "nginx.pid")) as f:
                    self.nginx_pid = int(f.read().strip())
                return self.nginx_port
            except (OSError, ValueError):
                time.sleep(0.01)
        raise RuntimeError("nginx (blob storage server) did not start")

    def pids(self):
        """The registry and, for `redirect`, its nginx workers: whose CPU a fetch costs."""
        out = [self.proc.pid]
        if self.nginx_pid is not None:
            ps = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.nginx_pid)],
                                capture_output=True, text=True).stdout.split()
            out += [int(p) for p in ps]
        return out

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def stop_all(self):
        self.stop()
        if self.nginx_pid is not None:
            try:
                os.kill(self.nginx_pid, 15)
            except OSError:
                pass
            self.nginx_pid = None


def site_cache(work, registry_port):
    """nginx with the README's site-cache recipe in front of the registry; returns its port."""
    os.makedirs(os.path.join(work, "tmp"), exist_ok=True)
    port = free_port()
    user = "user root;" if os.geteuid() == 0 else ""
    up = f"http://127.0.0.1:{registry_port}"
    conf = f"""{user}
worker_processes 2; pid {work}/nginx.pid; error_log {work}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off; sendfile on; tcp_nopush on; tcp_nodelay on;
  client_body_temp_path {work}/tmp/body; proxy_temp_path {work}/tmp/proxy;
  fastcgi_temp_path {work}/tmp/fastcgi; uwsgi_temp_path {work}/tmp/uwsgi; scgi_temp_path {work}/tmp/scgi;
  proxy_cache_path {work}/cache levels=1:2 keys_zone=cubist_blobs:10m max_size=10g inactive=7d use_temp_path=off;
  server {{
    listen 127.0.0.1:{port};
    location ~ "^/v2/.+/blobs/sha256:[0-9a-f]{{64}}$" {{
      proxy_pass {up}; proxy_cache cubist_blobs; proxy_cache_key $uri; proxy_cache_valid 200 7d;
      proxy_cache_lock on; proxy_cache_lock_timeout 10m; proxy_cache_lock_age 10m;
      proxy_http_version 1.1; proxy_set_header Connection "";
    }}
    location /v2/ {{ proxy_pass {up}; proxy_http_version 1.1; proxy_set_header Connection ""; }}
  }}
}}
"""
    with open(os.path.join(work, "nginx.conf"), "w") as f:
        f.write(conf)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    run([nginx, "-p", work, "-c", os.path.join(work, "nginx.conf")])
    return port


def oci_layout(layout, repo, files, manifest_path, cubist_manifest_bytes):
    """The set as an OCI image layout (what skopeo copies): the same blobs and an image
    manifest shaped like cubist's (layer media type tar, which skopeo copies as is)."""
    blobs = os.path.join(layout, "blobs", "sha256")
    os.makedirs(blobs, exist_ok=True)

    def put(data=None, path=None):
        if path:
            with open(path, "rb") as f:
                data = f.read()
        d = hashlib.sha256(data).hexdigest()
        with open(os.path.join(blobs, d), "wb") as f:
            f.write(data)
        return {"digest": "sha256:" + d, "size": len(data)}

    cfg = put(b"{}")
    layers = [dict(put(cubist_manifest_bytes), mediaType="application/vnd.oci.image.layer.v1.tar",
                   annotations={"org.opencontainers.image.title": "manifest.json"})]
    for rel in files:
        layers.append(dict(put(path=os.path.join(repo, rel)), mediaType="application/vnd.oci.image.layer.v1.tar",
                           annotations={"org.opencontainers.image.title": rel}))
    man = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "config": dict(cfg, mediaType="application/vnd.oci.image.config.v1+json"), "layers": layers}
    m = put(json.dumps(man).encode())
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion": "1.0.0"}')
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [dict(m, mediaType="application/vnd.oci.image.manifest.v1+json",
                                                           annotations={"org.opencontainers.image.ref.name": "v1"})]}, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cubist", default=os.path.join(ROOT, "build/cli/cubist"))
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--skopeo-runs", type=int, default=1,
                    help="skopeo copy takes minutes for 1,000 blobs; time it this many rounds")
    args = ap.parse_args()
    if not shutil.which("docker-registry"):
        sys.exit("oci_bench: docker-registry is not installed (scripts/install-deps)")

    work = args.workdir or tempfile.mkdtemp(prefix="cubist-oci-bench.")
    repo = os.path.join(work, "repo")
    rng = random.Random(1234)  # the same set as fetch_bench.py
    files = []
    for i in range(args.files):
        size = int(min(2_000_000, max(20_000, rng.lognormvariate(math.log(250_000), 0.35))))
        rel = f"cubins/sm_90a/bmm_{i:04d}.cubin"
        path = os.path.join(repo, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rng.randbytes(size))
        files.append(rel)
    total = sum(os.path.getsize(os.path.join(repo, r)) for r in files)
    manifest = os.path.join(repo, "manifest.json")
    run([args.cubist, "manifest", "build", repo, "--name", "bench", "--version", "1", "-o", manifest + ".tmp"])
    os.replace(manifest + ".tmp", manifest)
    with open(manifest, "rb") as f:
        manifest_bytes = f.read()

    url = subprocess.run([os.path.join(ROOT, "scripts/serve-nginx"), repo, os.path.join(work, "nginx")],
                         check=True, capture_output=True, text=True).stdout.strip()
    reg = Registry(os.path.join(work, "registry"))
    os.makedirs(reg.work, exist_ok=True)
    skopeo = shutil.which("skopeo")
    layout = os.path.join(work, "layout")
    if skopeo:
        oci_layout(layout, repo, files, manifest, manifest_bytes)
    ref = f"oci://127.0.0.1:{reg.port}/bench/set:v1"
    # The tuned registries read the storage the plain one was pushed to.
    tuned = {v: Registry(os.path.join(work, "registry-" + v), reg.storage, v) for v in ("tuned", "redirect")}
    tuned_t = {v: [] for v in tuned}
    cpu = {v: [] for v in ("plain", "tuned", "redirect")}
    cache = os.path.join(work, "cache")
    push_t, skopeo_t, reg_t, nginx_t, site_t = [], [], [], [], []
    site_work = os.path.join(work, "site-cache")
    site_ref = None
    try:
        for r in range(args.runs):
            # Push to an empty registry.
            reg.stop(); reg.start(wipe=True)
            os.sync()
            t = time.perf_counter()
            run([args.cubist, "push", "-q", "-j", str(args.jobs), "--manifest", manifest, ref])
            push_t.append(time.perf_counter() - t)
            if skopeo and r < args.skopeo_runs:
                reg.stop(); reg.start(wipe=True)
                os.sync()
                t = time.perf_counter()
                run([skopeo, "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:v1",
                     f"docker://127.0.0.1:{reg.port}/bench/skopeo:v1"])
                skopeo_t.append(time.perf_counter() - t)
                # Leave the registry holding cubist's push for the fetch rounds.
                reg.stop(); reg.start(wipe=True)
                run([args.cubist, "push", "-q", "--manifest", manifest, ref])
            if site_ref is None:
                # The site cache, filled once through the registry (untimed); later rounds
                # measure a node's cold fetch when the site cache already holds the set.
                shutil.rmtree(site_work, ignore_errors=True)
                os.makedirs(site_work)
                site_port = site_cache(site_work, reg.port)
                site_ref = f"oci://127.0.0.1:{site_port}/bench/set:v1"
                run([args.cubist, "fetch", "-q", "--manifest", site_ref, "--cache", os.path.join(work, "prefill")])
            for t_reg in tuned.values():  # fresh processes over this round's push
                t_reg.stop()
                t_reg.start()
            # Cold fetches (an empty node cache), the sources interleaved.
            sources = [("nginx", url + "manifest.json", nginx_t, None), ("plain", ref, reg_t, reg)]
            sources += [(v, f"oci://127.0.0.1:{r.port}/bench/set:v1", tuned_t[v], r) for v, r in tuned.items()]
            sources += [("site", site_ref, site_t, None)]
            for name, src, out, server in sources:
                shutil.rmtree(cache, ignore_errors=True)
                os.sync()
                time.sleep(0.5)
                c = cpu_seconds(server.pids()) if server else 0.0
                t = time.perf_counter()
                run([args.cubist, "fetch", "-q", "--manifest", src, "--cache", cache, "-j", str(args.jobs)])
                out.append(time.perf_counter() - t)
                if server:
                    cpu[name].append(cpu_seconds(server.pids()) - c)
    finally:
        reg.stop_all()
        for t_reg in tuned.values():
            t_reg.stop_all()
        try:
            with open(os.path.join(site_work, "nginx.pid")) as f:
                os.kill(int(f.read().strip()), 15)
        except OSError:
            pass
        try:
            with open(os.path.join(work, "nginx", "nginx.pid")) as f:
                os.kill(int(f.read().strip()), 15)
        except OSError:
            pass

    med = statistics.median
    print(f"{args.files} files, {total / 1e6:.0f} MB, median of {args.runs} runs, -j{args.jobs}, "
          f"load average at the end {os.getloadavg()[0]:.1f}\n")
    print("| what | median s | all runs s | server CPU s (median) | ratio |")
    print("| --- | ---: | --- | ---: | ---: |")
    fmt = lambda ts: " ".join(f"{x:.2f}" for x in ts)
    print(f"| cold `cubist fetch` from nginx (files) | {med(nginx_t):.2f} | {fmt(nginx_t)} | | 1.00x |")
    rows = [("plain", "docker-registry, plain config", reg_t),
            ("tuned", "docker-registry, blobdescriptor inmemory + GOGC=400", tuned_t["tuned"]),
            ("redirect", "docker-registry, tuned + redirect to nginx over its storage (CPU: both)",
             tuned_t["redirect"])]
    for v, what, ts in rows:
        print(f"| cold `cubist fetch` from {what} (oci://) | {med(ts):.2f} | {fmt(ts)} | "
              f"{med(cpu[v]):.2f} | {med(ts) / med(nginx_t):.2f}x (target <= 1.3x) |")
    print(f"| cold `cubist fetch` through the nginx site cache (oci://, cache filled) | {med(site_t):.2f} | {fmt(site_t)} | | "
          f"{med(site_t) / med(nginx_t):.2f}x |")
    print(f"| `cubist push` to an empty registry (plain config) | {med(push_t):.2f} | {fmt(push_t)} | | 1.00x |")
    if skopeo_t:
        print(f"| `skopeo copy` oci-layout -> registry (Debian skopeo) | {med(skopeo_t):.2f} | {fmt(skopeo_t)} | | "
              f"{med(skopeo_t) / med(push_t):.2f}x of cubist |")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
