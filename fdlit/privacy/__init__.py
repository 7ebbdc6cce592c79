"""Privacy of what clients upload: the Gaussian mechanism with a per-client (epsilon, delta) accountant,
driven by each method's declaration of what it releases, encodings that share less, and a
membership-inference audit (docs/privacy.md)."""

from fdlit.privacy.accounting import ClientAccountant, make_accountant, sampled_epsilon
from fdlit.privacy.audit import membership_auc, membership_audit
from fdlit.privacy.encoding import ENCODINGS, decode, encode, encoded_bytes
from fdlit.privacy.release import Release
from fdlit.privacy.upload import UploadPrivacy

__all__ = ["ENCODINGS", "ClientAccountant", "Release", "UploadPrivacy", "decode", "encode", "encoded_bytes",
           "make_accountant", "membership_audit", "membership_auc", "sampled_epsilon"]
