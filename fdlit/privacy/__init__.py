"""Privacy of what clients upload: the Gaussian mechanism with a per-client (epsilon, delta) accountant,
driven by each method's declaration of what it releases, secure aggregation of the rules that are sums,
encodings that share less, and attacks that measure what uploads and models reveal (docs/privacy.md)."""

from fdlit.privacy.accounting import ClientAccountant, make_accountant, sampled_epsilon
from fdlit.privacy.audit import membership_auc, membership_audit
from fdlit.privacy.encoding import ENCODINGS, decode, encode, encoded_bytes
from fdlit.privacy.receive import UploadRound
from fdlit.privacy.release import Release
from fdlit.privacy.secure_upload import SecureSums, maskable, masked_sums
from fdlit.privacy.upload import UploadPrivacy
from fdlit.privacy.upload_audit import label_inference, prediction_membership

__all__ = ["ENCODINGS", "ClientAccountant", "Release", "SecureSums", "UploadPrivacy", "UploadRound", "decode", "encode",
           "encoded_bytes", "label_inference", "make_accountant", "maskable", "masked_sums", "membership_audit",
           "membership_auc", "prediction_membership", "sampled_epsilon"]
