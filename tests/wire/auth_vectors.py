#!/usr/bin/env python3
"""Regenerates the proof vectors in tests/wire/auth_test.cc with Python's own hmac module:
HMAC-SHA256(key, b"chunkserve-auth-v1" || nonce || role byte), nonce = bytes 0..31."""
import hashlib
import hmac

KEY = b"0123456789abcdef0123456789abcdef"
NONCE = bytes(range(32))
for name, role in (("CLIENT", 0), ("WORKER", 1), ("ROUTER", 2)):
    proof = hmac.new(KEY, b"chunkserve-auth-v1" + NONCE + bytes([role]), hashlib.sha256)
    print(name, proof.hexdigest())
