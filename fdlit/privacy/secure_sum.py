"""Secure aggregation: the server learns the sum of the clients' vectors and nothing else about any one
of them, and clients may drop out after masking (Bonawitz et al. 2017, *Practical secure aggregation
for privacy-preserving machine learning*, the semi-honest protocol with double masking).

One aggregation among the round's sampled clients U1, of which U2 send their masked vector:

0. advertise keys: every u in U1 makes an X25519 key pair (s_u) and sends its public key; the server
   broadcasts all of them;
1. share keys: u draws a self-mask seed b_u and Shamir-shares (threshold t) its private key and b_u
   among U1; the shares travel encrypted client to client through the server;
2. masked input: u in U2 encodes its vector x_u in fixed point (below) and sends
       y_u = x_u + PRG(b_u) + sum_{v in U1, v > u} PRG(s_uv) - sum_{v in U1, v < u} PRG(s_uv)   (mod 2^64)
   where s_uv = HKDF(X25519(s_u, s_v)) is the secret u and v agree on; the pairwise masks cancel in
   the sum over U1;
3. unmasking: the survivors (|U2| >= t, else the round has no aggregate) reveal their shares of b_u for
   every u in U2 and of the private key of every v in U1 \\ U2 (a client that dropped after sharing);
   the server rebuilds those, removes the self-masks and the dropped clients' pairwise masks, and has
   sum_{u in U2} x_u.

The PRG is ChaCha20's key stream keyed by HKDF-SHA256 of the secret (the ``cryptography`` library);
Shamir's scheme over the prime field 2^521 - 1 is a few lines, written here.

**Fixed point.** Arithmetic is in Z_{2^64} (numpy uint64, which wraps). A channel whose per-client
values lie in [-B, B] (clipped there) is scaled by 2^s with s = 62 - ceil(log2(B n)), n = |U1|, so
the sum over n clients stays below 2^62 and decodes without wrap-around; each client's value is
rounded to a multiple of 2^-s, so the decoded sum is within n 2^-(s+1) of the exact one.

**What the simulation does not do.** The shares are not encrypted in process (their ciphertext bytes
are counted: share + 28 bytes of ChaCha20-Poly1305 nonce and tag), and no party is malicious: the
server follows the protocol (the semi-honest setting of Bonawitz et al.'s first protocol).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

PRIME = 2**521 - 1  # Shamir's field: a Mersenne prime above every 32-byte secret
SHARE_BYTES = 66 + 4  # one field element and the share's x (a client index)
AEAD_BYTES = 28  # ChaCha20-Poly1305: 12-byte nonce, 16-byte tag
KEY_BYTES = 32  # an X25519 public key
HEADROOM_BITS = 62  # the decoded sum stays below 2^62 < 2^63 (int64 reads it back)
EXCHANGES = 3  # message exchanges secure aggregation adds to a round: keys, shares, unmasking


def scale_bits(bound: float, clients: int) -> int:
    """s of the module docstring: values in [-bound, bound] from ``clients`` clients, scaled by 2^s."""
    return HEADROOM_BITS - math.ceil(math.log2(bound * max(clients, 1)))


def encode(x: np.ndarray, bound: float, bits: int) -> np.ndarray:
    """Fixed point: x clipped to [-bound, bound], times 2^bits, rounded, as uint64 (two's complement)."""
    q = np.rint(np.ldexp(np.clip(np.asarray(x, dtype=np.float64), -bound, bound), bits)).astype(np.int64)
    return q.view(np.uint64)


def decode(total: np.ndarray, bits: int) -> np.ndarray:
    return np.ldexp(total.view(np.int64).astype(np.float64), -bits)


def fixed_point_error(clients: int, bits: int) -> float:
    """The largest distance between a decoded sum of ``clients`` values and the exact sum."""
    return clients * 2.0 ** -(bits + 1)


# ---------------------------------------------------------------------- Shamir over GF(2^521 - 1)
def shamir_share(secret: int, n: int, t: int) -> list[tuple[int, int]]:
    """n shares (x = 1..n) of ``secret``, any t of which rebuild it."""
    coefficients = [secret] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % PRIME
        shares.append((x, y))
    return shares


def shamir_reconstruct(shares: list[tuple[int, int]]) -> int:
    """The secret from t or more shares (Lagrange interpolation at 0)."""
    secret = 0
    for j, (xj, yj) in enumerate(shares):
        num, den = 1, 1
        for m, (xm, _) in enumerate(shares):
            if m != j:
                num, den = num * -xm % PRIME, den * (xj - xm) % PRIME
        secret = (secret + yj * num * pow(den, -1, PRIME)) % PRIME
    return secret


# ---------------------------------------------------------------------- key agreement and masks
def _kdf(secret: bytes, info: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def prg(seed: bytes, length: int, info: bytes) -> np.ndarray:
    """``length`` uint64 words of ChaCha20's key stream under HKDF(seed, info)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    stream = Cipher(algorithms.ChaCha20(_kdf(seed, info), b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(stream.update(b"\0" * (8 * length)), dtype=np.uint64)


def agree(private: bytes, public: bytes) -> bytes:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    return X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(public))


def keypair() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key = X25519PrivateKey.generate()
    return key.private_bytes_raw(), key.public_key().public_bytes_raw()


@dataclass
class Participant:
    """One client's state in one aggregation."""

    id: int
    private: bytes
    public: bytes
    self_seed: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    held: dict[int, tuple[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)  # from v: shares of (key, b_v)

    def mask(self, x: np.ndarray, keys: dict[int, bytes], info: bytes) -> np.ndarray:
        """y_u of the module docstring."""
        y = x + prg(self.self_seed, len(x), info + b"self")
        for v, public in keys.items():
            if v == self.id:
                continue
            pair = prg(agree(self.private, public), len(x), info + b"pair")
            y = y + pair if self.id < v else y - pair
        return y


# ---------------------------------------------------------------------- one aggregation
Send = Callable[[int, str, str, np.ndarray], None]  # (client, direction, kind, bytes as uint8/uint64 array)


def threshold(clients: int, fraction: float) -> int:
    """t: at least 2 shares (one client alone never rebuilds another's secrets), at most all of them."""
    return min(clients, max(2, math.ceil(fraction * clients)))


def secure_sum(sampled: list[int], vectors: dict[int, np.ndarray], send: Send, round: int = 0,
               fraction: float = 0.5) -> tuple[np.ndarray | None, dict[str, float]]:
    """The sum of ``vectors`` (client -> uint64 vector, the fixed-point encodings of the clients of U2)
    over the protocol of the module docstring, with U1 = ``sampled`` and t = ``threshold(|U1|, fraction)``;
    ``send`` counts every message.
    Returns the sum mod 2^64 (None when fewer than t clients survive) and the aggregation's metrics."""
    start = time.perf_counter()
    u1, u2 = list(sampled), [u for u in sampled if u in vectors]
    n, length = len(u1), len(next(iter(vectors.values()))) if vectors else 0
    t = threshold(n, fraction)
    info = b"fdlit secagg round %d" % round
    index = {u: j + 1 for j, u in enumerate(u1)}  # the x of u's shares
    # 0. advertise keys
    people = {u: Participant(u, *keypair()) for u in u1}
    keys = {u: p.public for u, p in people.items()}
    for u in u1:
        send(u, "up", "secagg_keys", np.zeros(KEY_BYTES + 4, np.uint8))
        send(u, "down", "secagg_keys", np.zeros(n * (KEY_BYTES + 4), np.uint8))
    # 1. share keys
    for u, p in people.items():
        key_shares = shamir_share(int.from_bytes(p.private, "little"), n, t)
        seed_shares = shamir_share(int.from_bytes(p.self_seed, "little"), n, t)
        for v in u1:
            people[v].held[u] = (key_shares[index[v] - 1], seed_shares[index[v] - 1])
        ciphertexts = np.zeros((n - 1) * (2 * SHARE_BYTES + AEAD_BYTES), np.uint8)
        send(u, "up", "secagg_shares", ciphertexts)
        send(u, "down", "secagg_shares", ciphertexts)  # each client gets one ciphertext from every other
    # 2. masked input
    masked = {}
    for u in u2:
        masked[u] = people[u].mask(vectors[u], keys, info)
        send(u, "up", "secagg_masked", masked[u])
    dropped = [v for v in u1 if v not in masked]
    stats = {"secagg/clients": float(n), "secagg/dropped_after_sharing": float(len(dropped)),
             "secagg/threshold": float(t), "secagg/extra_exchanges": float(EXCHANGES)}
    if len(u2) < t:
        stats.update({"secagg/failed": 1.0, "time/secagg_s": time.perf_counter() - start})
        return None, stats
    # 3. unmasking: every survivor reveals its shares of b_u (u in U2) and of the dropped clients' keys
    for u in u2:
        send(u, "down", "secagg_survivors", np.zeros(4 * len(u2), np.uint8))
        send(u, "up", "secagg_unmask", np.zeros(len(u1) * SHARE_BYTES, np.uint8))
    helpers = u2[:t]  # any t survivors' shares suffice
    total = np.zeros(length, np.uint64)
    for u in u2:
        total = total + masked[u]
        seed = shamir_reconstruct([people[h].held[u][1] for h in helpers])
        total = total - prg(seed.to_bytes(32, "little"), length, info + b"self")
    for v in dropped:  # its pairwise masks with every survivor did not cancel
        private = shamir_reconstruct([people[h].held[v][0] for h in helpers]).to_bytes(32, "little")
        for u in u2:
            pair = prg(agree(private, keys[u]), length, info + b"pair")
            total = total - pair if u < v else total + pair  # u added +pair when u < v: remove it
    stats.update({"secagg/failed": 0.0, "time/secagg_s": time.perf_counter() - start})
    return total, stats
