"""The membership attack on the uploads' models: shadows never trained on the target, and the models
attacked are those that made the round's uploads (right after the private phase)."""

from __future__ import annotations

import torch

from fdlit.privacy.upload_audit import prediction_membership
from tests.fitting import fit_loop, tiny


def memorising(private, c):
    g = torch.Generator().manual_seed(1)

    def run(x):
        z = torch.zeros(len(private), len(x), c)
        for i, (own, y) in enumerate(private):
            seen = (x[:, None, :] == own[None]).all(-1).any(-1)
            z[i, :, y[0]] = torch.where(seen, 6.0, 1.0) + 0.1 * torch.randn(len(x), generator=g)
        return z
    return run


def test_a_client_that_trained_on_the_target_is_never_its_shadow():
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(40, 3, generator=g)
    # clients 0, 1 and 2 hold class 0; 0 and 1 trained on the same samples, 2 on others; 3 holds class 1
    zeros, ones = torch.zeros(40, dtype=torch.long), torch.ones(40, dtype=torch.long)
    private = [(shared, zeros), (shared.clone(), zeros), (torch.randn(40, 3, generator=g), zeros),
               (torch.randn(40, 3, generator=g), ones)]
    test_x, test_y = torch.randn(80, 3, generator=g), torch.arange(80) % 2
    mask = torch.stack([test_y == y[0] for _, y in private])
    out = prediction_membership(memorising(private, 2), private, test_x, test_y, mask)
    # client 0's members are scored against client 2 only (client 1 saw them, and memorised them too):
    # the attack finds them; had client 1 been a shadow its confidence would have hidden them
    assert out["clients/privacy/upload_mia_auc"][0] > 0.95
    alike = [(shared, zeros), (shared.clone(), zeros), (shared.clone(), zeros), private[3]]
    none_left = prediction_membership(memorising(alike, 2), alike, test_x, test_y, mask)
    # every other client of class 0 trained on client 0's samples: no shadow is left, none is scored
    assert none_left["privacy/upload_mia_unscored"] > 0.7
    assert none_left["clients/privacy/upload_mia_auc"][0] != none_left["clients/privacy/upload_mia_auc"][0]  # nan


def test_the_audit_attacks_the_models_that_made_the_uploads_before_distillation(tmp_path, monkeypatch):
    import fdlit.federation.client_side as client_side
    import fdlit.federation.measurement as measurement

    order = []
    audit, distil = measurement.upload_membership, client_side.ClientSide.distil
    monkeypatch.setattr(measurement, "upload_membership", lambda parts: order.append("audit") or audit(parts))
    monkeypatch.setattr(client_side.ClientSide, "distil",
                        lambda self, *a, **k: order.append("distil") or distil(self, *a, **k))
    loop = fit_loop(tiny("digits_avg.yaml", tmp_path, "--privacy.upload_audit", "true", rounds=2))
    assert order == ["audit", "distil", "audit", "distil"]
    assert all(0 <= h["privacy/upload_mia_auc"] <= 1 for h in loop.history)
