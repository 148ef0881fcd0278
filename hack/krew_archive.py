"""Build the archive the krew manifest (plugins/krew/phalanx.yaml) installs: a gzipped tar of the
launcher plugins/krew/kubectl-phalanx, byte for byte the same on every build (fixed
owner, mode and times), so the manifest's sha256 is checked in and a unit test rebuilds it.

    python hack/krew_archive.py [OUT]   # default dist/kubectl-phalanx.tar.gz; prints its sha256
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pathlib
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = {"kubectl-phalanx": (ROOT / "plugins" / "krew" / "kubectl-phalanx", 0o755)}


def archive_bytes() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (path, mode) in sorted(FILES.items()):
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def main(out: str = str(ROOT / "dist" / "kubectl-phalanx.tar.gz")) -> int:
    data = archive_bytes()
    target = pathlib.Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    print(f"{target}  sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
