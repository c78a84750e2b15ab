"""Shared fixtures of the Python tests: a tiny published kernel set served by nginx on
loopback (scripts/serve-nginx, as the C++ tests and the demo do) and the built `cubist`
command for comparing reports."""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def write_set(root):
    """Two artifacts and two kernel entries (metadata only: nothing is launched)."""
    root.mkdir(parents=True, exist_ok=True)
    artifacts, kernels = [], []
    for i, act in enumerate(("swiglu", "identity")):
        name = f"moe_gemm_tma_bf16_bf16_{act}_m64n128k64"
        data = (f"not a real cubin {i}\n" * 50).encode()
        path = f"cubins/sm_90a/{name}.cubin"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        artifacts.append({"path": path, "sha256": hashlib.sha256(data).hexdigest(),
                          "size": len(data)})
        kernels.append({"name": name, "artifact": path, "function": name, "arch": "sm_90a",
                        "op": "moe_gemm", "abi": 2, "weight_format": "bf16",
                        "activation_format": "bf16", "activation": act, "tile_m": 64,
                        "tile_n": 128, "tile_k": 64, "cluster": [1, 1, 1], "stages": 4,
                        "threads": 256, "shared_mem_bytes": 107656,
                        "gated": act == "swiglu", "k_multiple": 8, "n_multiple": 16,
                        "ptr_align": 16, "mma_efficiency": 0.77, "memory_efficiency": 0.85,
                        "ctas_per_sm": 2, "max_experts": 1024})
    manifest = {"schema": "cubist.manifest/1", "name": "py-test-set", "version": 1,
                "artifacts": artifacts, "kernels": kernels}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return root / "manifest.json"


@pytest.fixture(scope="session")
def served_set(tmp_path_factory):
    """(manifest URL, local manifest path) of the set, served by nginx."""
    base = tmp_path_factory.mktemp("served")
    manifest = write_set(base / "repo")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.access(nginx, os.X_OK):
        pytest.skip("nginx is not installed (scripts/install-deps)")
    url = subprocess.run([str(REPO / "scripts/serve-nginx"), str(base / "repo"),
                          str(base / "nginx")], check=True, capture_output=True,
                         text=True).stdout.strip()
    yield url + "manifest.json", manifest
    pid = int((base / "nginx/nginx.pid").read_text())
    os.kill(pid, 15)


@pytest.fixture(scope="session")
def cli():
    """The `cubist` command of the same build, for report comparisons."""
    path = os.environ.get("CUBIST_CLI") or str(REPO / "build/cli/cubist")
    if not os.access(path, os.X_OK):
        pytest.skip(f"no built cubist command at {path} (set CUBIST_CLI)")
    return path
