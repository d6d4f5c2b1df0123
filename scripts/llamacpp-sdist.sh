#!/usr/bin/env bash
# The PyPI sdist of llama-cpp-python (VER, default the version ../shared/testdata
# was made with), fetched once into target/llamacpp/sdist with PyPI's sha256
# checked; prints the archive's path. Straight from PyPI's simple index:
# `pip download` would build the sdist to read its metadata.
set -euo pipefail
cd "$(dirname "$0")/.."
VER=${VER:-0.3.36}
D=$PWD/target/llamacpp/sdist
mkdir -p "$D"
python3 - "$VER" "$D" >&2 <<'PY'
import hashlib, json, os, sys, urllib.request
ver, dest = sys.argv[1], sys.argv[2]
name = f"llama_cpp_python-{ver}.tar.gz"
path = f"{dest}/{name}"
# PEP 691 JSON: the file and its sha256.
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
sdist = next(f for f in files if f["filename"] == name)
if not os.path.exists(path):
    print(f"fetching {name} from PyPI", file=sys.stderr)
    urllib.request.urlretrieve(sdist["url"], path + ".part")
    os.replace(path + ".part", path)
digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
if digest != sdist["hashes"]["sha256"]:
    os.remove(path)
    sys.exit(f"{path}: sha256 {digest}, PyPI says {sdist['hashes']['sha256']}")
PY
echo "$D/llama_cpp_python-$VER.tar.gz"
