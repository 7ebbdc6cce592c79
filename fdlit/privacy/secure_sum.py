"""Secure aggregation: the server learns the sum of the clients' vectors and nothing else about any one
of them, and clients may drop out after masking (Bonawitz et al. 2017, *Practical secure aggregation
for privacy-preserving machine learning*, the semi-honest protocol with double masking).

One aggregation among the round's sampled clients U1, of which U2 send their masked vector:

0. advertise keys: every u in U1 makes two X25519 key pairs, c_u (encrypts its shares) and s_u (agrees
   its masks), and sends both public keys; the server broadcasts all of them;
1. share keys: u draws a self-mask seed b_u and Shamir-shares (threshold t) its private s_u and b_u
   among U1; the share for v is encrypted (ChaCha20-Poly1305 under HKDF(X25519(c_u, c_v))) and goes
   to v through the server, which cannot read it;
2. masked input: u in U2 encodes its vector x_u in fixed point (below) and sends
       y_u = x_u + PRG(b_u) + sum_{v in U1, v > u} PRG(s_uv) - sum_{v in U1, v < u} PRG(s_uv)   (mod 2^64)
   where s_uv = HKDF(X25519(s_u, s_v)) is the secret u and v agree on; the pairwise masks cancel in
   the sum over U1;
3. unmasking: the survivors (|U2| >= t, else the round has no aggregate) reveal their shares of b_u for
   every u in U2 and of the private s_v of every v in U1 \\ U2 (a client that dropped after sharing),
   never both for one client; the server rebuilds those, removes the self-masks and the dropped
   clients' pairwise masks, and has sum_{u in U2} x_u.

Two key pairs, as in Bonawitz et al.: the server rebuilds a dropped client's s_v, and with one key pair
that would also open every share sent to or from v.

A client's half is :class:`Participant` (keys, shares, mask, reveal), the server's is :func:`unmask`;
:func:`secure_sum` runs both in one process (``fit``: the shares are handed over there as they are,
their ciphertexts' bytes counted); a deployment runs them on the nodes, encrypting every share, and in
the ServerApp (fdlit.deployment.secure_rounds). The PRG is ChaCha20's key stream keyed by HKDF-SHA256 of
the secret (the ``cryptography`` library); Shamir's scheme over the prime field 2^521 - 1 is a few
lines, written here.

**Fixed point.** Arithmetic is in Z_{2^64} (numpy uint64, which wraps). A channel whose per-client
values lie in [-B, B] (clipped there) is scaled by 2^s with s = 62 - ceil(log2(B n)), n = |U1|, so
the sum over n clients stays below 2^62 and decodes without wrap-around; each client's value is
rounded to a multiple of 2^-s, so the decoded sum is within n 2^-(s+1) of the exact one.

**Threat model.** Semi-honest: no party is malicious, the server follows the protocol (Bonawitz et
al.'s first protocol; the malicious variant's signatures and consistency checks are not run).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

PRIME = 2**521 - 1  # Shamir's field: a Mersenne prime above every 32-byte secret
FIELD_BYTES = 66  # one element of the field
SHARE_BYTES = FIELD_BYTES + 4  # one field element and the share's x (a client index)
AEAD_BYTES = 28  # ChaCha20-Poly1305: 12-byte nonce, 16-byte tag
KEY_BYTES = 32  # an X25519 public key
ADVERTISED_BYTES = 2 * KEY_BYTES  # c_u's and s_u's public keys
HEADROOM_BITS = 62  # the decoded sum stays below 2^62 < 2^63 (int64 reads it back)
EXCHANGES = 3  # exchanges added to a round: its one upload becomes keys, shares, masked input, unmasking


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


def threshold(clients: int, fraction: float) -> int:
    """t = max(2, ceil(fraction n)): at least 2 survivors, so that the sum is never one client's vector
    (and one client alone never rebuilds another's secrets); with fewer than 2 clients no aggregate."""
    return max(2, math.ceil(fraction * clients))


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


# ---------------------------------------------------------------------- key agreement, masks, encryption
def _kdf(secret: bytes, info: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def prg(seed: bytes, length: int, info: bytes) -> np.ndarray:
    """``length`` uint64 words of ChaCha20's key stream under HKDF(seed, info)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    stream = Cipher(algorithms.ChaCha20(_kdf(seed, info), b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(stream.update(b"\0" * (8 * length)), dtype=np.uint64)


def private_key(raw: bytes):
    """An X25519 private key from its raw bytes (made once per key: most of an agreement's time)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return X25519PrivateKey.from_private_bytes(raw)


def agree(key, public: bytes) -> bytes:
    """The X25519 secret of a ``private_key`` and a raw public key."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    return key.exchange(X25519PublicKey.from_public_bytes(public))


def keypair() -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key = X25519PrivateKey.generate()
    return key.private_bytes_raw(), key.public_key().public_bytes_raw()


def _aead(private, public: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    return ChaCha20Poly1305(_kdf(agree(private, public), b"fdlit secagg shares"))


def _bound(sender: int, recipient: int, info: bytes) -> bytes:
    """What a ciphertext is bound to (its associated data): who sent it to whom, in which aggregation."""
    return info + b" %d->%d" % (sender, recipient)


def mask_keys(advertised: dict[int, bytes]) -> dict[int, bytes]:
    """s_v's public key of every advertised pair (c_v's public key, s_v's)."""
    return {v: k[KEY_BYTES:] for v, k in advertised.items()}


@dataclass
class Participant:
    """One client's half of one aggregation; its secrets leave it only as shares, each encrypted for
    one other client, and as the shares it reveals to unmask."""

    id: int
    private: bytes  # s_u: agrees the pairwise masks
    public: bytes
    channel_private: bytes  # c_u: agrees the keys that encrypt shares
    channel_public: bytes
    self_seed: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    held: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # from v: (x, share of s_v, share of b_v)

    def __post_init__(self):  # the keys as objects, made once
        self._mask_key, self._channel_key = private_key(self.private), private_key(self.channel_private)

    @classmethod
    def new(cls, id: int) -> Participant:
        return cls(id, *keypair(), *keypair())

    @property
    def advertised(self) -> bytes:
        """Step 0: c_u's and s_u's public keys."""
        return self.channel_public + self.public

    def shares(self, u1: list[int], t: int) -> dict[int, tuple[int, int, int]]:
        """Step 1: (x, share of s_u, share of b_u) for every v of ``u1`` (x: v's place in u1, from 1); u
        keeps its own."""
        key_shares = shamir_share(int.from_bytes(self.private, "little"), len(u1), t)
        seed_shares = shamir_share(int.from_bytes(self.self_seed, "little"), len(u1), t)
        out = {v: (x, s, b) for (x, s), (_, b), v in zip(key_shares, seed_shares, u1, strict=True)}
        self.held[self.id] = out.pop(self.id)
        return out

    def share(self, u1: list[int], t: int, advertised: dict[int, bytes], info: bytes) -> dict[int, bytes]:
        """``shares``, each encrypted for its recipient (what travels through the server)."""
        out = {}
        for v, (x, s, b) in self.shares(u1, t).items():
            nonce = secrets.token_bytes(12)
            plain = x.to_bytes(4, "little") + s.to_bytes(FIELD_BYTES, "little") + b.to_bytes(FIELD_BYTES, "little")
            aead = _aead(self._channel_key, advertised[v][:KEY_BYTES])
            out[v] = nonce + aead.encrypt(nonce, plain, _bound(self.id, v, info))
        return out

    def receive(self, ciphertexts: dict[int, bytes], advertised: dict[int, bytes], info: bytes) -> None:
        """Step 1, on arrival: the shares other clients sent u (a forged or altered one fails to decrypt)."""
        for v, c in ciphertexts.items():
            plain = _aead(self._channel_key, advertised[v][:KEY_BYTES]).decrypt(c[:12], c[12:],
                                                                                   _bound(v, self.id, info))
            self.held[v] = (int.from_bytes(plain[:4], "little"), int.from_bytes(plain[4:4 + FIELD_BYTES], "little"),
                            int.from_bytes(plain[4 + FIELD_BYTES:], "little"))

    def mask(self, x: np.ndarray, keys: dict[int, bytes], info: bytes) -> np.ndarray:
        """Step 2: y_u of the module docstring; ``keys``: s_v's public key of every v that shared."""
        y = x + prg(self.self_seed, len(x), info + b"self")
        for v, public in keys.items():
            if v == self.id:
                continue
            pair = prg(agree(self._mask_key, public), len(x), info + b"pair")
            y = y + pair if self.id < v else y - pair
        return y

    def reveal(self, survivors: list[int], dropped: list[int]) -> dict[int, tuple[int, int]]:
        """Step 3: u's share of b_v for every survivor v and of s_v for every dropped v (never both)."""
        if set(survivors) & set(dropped):
            raise ValueError(f"clients {sorted(set(survivors) & set(dropped))} named both survivors and dropped: "
                             "revealing both shares would unmask them")
        out = {v: (self.held[v][0], self.held[v][2]) for v in survivors if v in self.held}
        return out | {v: (self.held[v][0], self.held[v][1]) for v in dropped if v in self.held}


def unmask(masked: dict[int, np.ndarray], revealed: dict[int, dict[int, tuple[int, int]]], keys: dict[int, bytes],
           t: int, info: bytes) -> np.ndarray:
    """The server's step 3: sum_{u in masked} x_u from the masked vectors, the survivors' ``revealed``
    shares (helper -> {v: share}) and s_v's public key of every client that shared (``keys``; those not
    in ``masked`` dropped after sharing). ValueError when a secret has fewer than t shares."""
    def rebuild(v: int) -> bytes:
        shares = [r[v] for r in revealed.values() if v in r][:t]
        if len(shares) < t:
            raise ValueError(f"{len(shares)} shares of client {v}'s secret, {t} needed")
        return shamir_reconstruct(shares).to_bytes(32, "little")

    length = len(next(iter(masked.values())))
    total = np.zeros(length, np.uint64)
    for u, y in masked.items():
        total = total + y - prg(rebuild(u), length, info + b"self")
    for v in (v for v in keys if v not in masked):  # its pairwise masks with every survivor did not cancel
        private = private_key(rebuild(v))
        for u in masked:
            pair = prg(agree(private, keys[u]), length, info + b"pair")
            total = total - pair if u < v else total + pair  # u added +pair when u < v: remove it
    return total


def info_of(round: int, stage: str = "") -> bytes:
    """What binds one aggregation's masks and ciphertexts to its round (and its stage, where a round
    runs two aggregations: fdlit.privacy.secure_softmax)."""
    return b"fdlit secagg round %d" % round + (b" " + stage.encode() if stage else b"")


# ---------------------------------------------------------------------- what travels, and one aggregation
Send = Callable[[int, str, str, np.ndarray], None]  # (client, direction, kind, bytes as uint8/uint64 array)


def count_messages(send: Send, u1: list[int], masked: dict[int, np.ndarray], unmasking: list[int]) -> None:
    """Every message of one aggregation as ``send`` counts it, per client: its keys, its shares (each
    encrypted share and its two client ids), its masked vector, and, for the survivors ``unmasking``,
    the survivors' list down and its revealed shares up. The same in ``fit`` and in a deployment."""
    n = len(u1)
    ciphertexts = np.zeros((n - 1) * (2 * SHARE_BYTES + AEAD_BYTES), np.uint8)
    for u in u1:
        send(u, "up", "secagg_keys", np.zeros(ADVERTISED_BYTES + 4, np.uint8))
        send(u, "down", "secagg_keys", np.zeros(n * (ADVERTISED_BYTES + 4), np.uint8))
        send(u, "up", "secagg_shares", ciphertexts)
        send(u, "down", "secagg_shares", ciphertexts)  # each client gets one ciphertext from every other
    for u, y in masked.items():
        send(u, "up", "secagg_masked", y)
    for u in unmasking:
        send(u, "down", "secagg_survivors", np.zeros(4 * len(unmasking), np.uint8))
        send(u, "up", "secagg_unmask", np.zeros(n * SHARE_BYTES, np.uint8))


def secure_sum(sampled: list[int], vectors: dict[int, np.ndarray], send: Send, round: int = 0,
               fraction: float = 0.5, stage: str = "") -> tuple[np.ndarray | None, dict[str, float]]:
    """The sum of ``vectors`` (client -> uint64 vector, the fixed-point encodings of the clients of U2)
    over the protocol of the module docstring, every party in this process, with U1 = ``sampled`` and
    t = ``threshold(|U1|, fraction)``; ``send`` counts every message.
    Returns the sum mod 2^64 (None when fewer than t clients survive) and the aggregation's metrics."""
    start = time.perf_counter()
    u1, u2 = list(sampled), [u for u in sampled if u in vectors]
    n, t, info = len(u1), threshold(len(u1), fraction), info_of(round, stage)
    people = {u: Participant.new(u) for u in u1}  # 0. advertise keys
    advertised = {u: p.advertised for u, p in people.items()}
    for u, p in people.items():  # 1. share keys (in one process: handed over as they are; the bytes are counted)
        for v, share in p.shares(u1, t).items():
            people[v].held[u] = share
    keys = mask_keys(advertised)
    masked = {u: people[u].mask(vectors[u], keys, info) for u in u2}  # 2. masked input
    dropped = [v for v in u1 if v not in masked]
    stats = {"secagg/clients": float(n), "secagg/dropped_after_sharing": float(len(dropped)),
             "secagg/survivors": float(len(u2)), "secagg/threshold": float(t),
             "secagg/extra_exchanges": float(EXCHANGES)}
    survived = len(u2) >= t
    count_messages(send, u1, masked, u2 if survived else [])
    if not survived:
        stats.update({"secagg/failed": 1.0, "time/secagg_s": time.perf_counter() - start})
        return None, stats
    revealed = {h: people[h].reveal(u2, dropped) for h in u2}  # 3. unmasking
    total = unmask(masked, revealed, keys, t, info)
    stats.update({"secagg/failed": 0.0, "time/secagg_s": time.perf_counter() - start})
    return total, stats
