"""Privacy of what clients upload: the Gaussian mechanism with an (epsilon, delta) accountant,
encodings that share less, and a membership-inference audit (docs/privacy.md)."""

from fdlit.privacy.audit import membership_auc, membership_audit
from fdlit.privacy.encoding import ENCODINGS, decode, encode, encoded_bytes
from fdlit.privacy.upload import UploadPrivacy, make_accountant

__all__ = ["ENCODINGS", "UploadPrivacy", "decode", "encode", "encoded_bytes", "make_accountant", "membership_audit",
           "membership_auc"]
