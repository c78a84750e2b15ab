"""The `cubist` console script of the wheel: runs the real command, cubist/_bin/cubist
(the C++ CLI, installed as package data with the shared libraries it needs vendored
beside the package), in place of this interpreter, so that its output, signals and exit
codes (README "Exit codes") are the command's own and no Python stays in between."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "cubist")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"cubist: the command {exe} is missing or not executable; "
                         f"reinstall the package (pip install --force-reinstall "
                         f"cubist-kernels)\n")
        return 127
    os.execv(exe, ["cubist"] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
