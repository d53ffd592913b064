"""MUNGE credentials per second through slurm_recovery.auth (libmunge via ctypes), one thread.

    .venv/bin/python bench/munge_rate.py [--socket PATH] [--count N] [--quick] [--json FILE]

Encodes N credentials carrying a request claim, then decodes each once (a credential decodes
only once: munged rejects replays), then does the same through sign/verify. Needs a running
munged; the local cluster's is at <base>/munge/munge.socket.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from report import write_json

from slurm_recovery.contract import munge, requests


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:8.0f} credentials/s ({count} in {seconds:.2f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", default=None, help="munged socket (default: libmunge's)")
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="300 credentials (for CI)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.count = min(args.count, 300)
    body = b'{"events":[{"node":"n1","kind":"xid","xid":79,"gpu":0}]}'
    payload = requests.claim("POST", "/v1/evidence", body, role="sidecar", node="n1")

    for _ in range(50):  # warm up munged's threads and the library
        munge.decode(munge.encode(payload, socket=args.socket), socket=args.socket)

    t0 = time.perf_counter()
    creds = [munge.encode(payload, socket=args.socket) for _ in range(args.count)]
    t1 = time.perf_counter()
    for cred in creds:
        munge.decode(cred, socket=args.socket)
    t2 = time.perf_counter()
    print(f"encode        {rate(args.count, t1 - t0)}")
    print(f"decode        {rate(args.count, t2 - t1)}")

    signed = [
        requests.sign("POST", "/v1/evidence", body, role="sidecar", node="n1", socket=args.socket)
        for _ in range(args.count)
    ]
    t3 = time.perf_counter()
    for headers in signed:
        requests.verify(
            headers, "POST", "/v1/evidence", body, socket=args.socket, max_age=60, now=time.time()
        )
    t4 = time.perf_counter()
    print(f"verify        {rate(args.count, t4 - t3)}  (decode + claim checks + replay cache)")
    print(f"payload bytes {len(payload)}, credential chars {len(creds[0])}")
    figures = {
        "count": args.count,
        "per_second": {
            "encode": round(args.count / (t1 - t0)),
            "decode": round(args.count / (t2 - t1)),
            "verify": round(args.count / (t4 - t3)),
        },
        "payload_bytes": len(payload),
        "credential_chars": len(creds[0]),
    }
    write_json(args.json, "munge_rate", figures, args.quick)


if __name__ == "__main__":
    main()
