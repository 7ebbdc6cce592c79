"""Adversarial clients: attacks on what a client trains on or uploads, and who attacks
(the ``adversaries`` section; docs/adversaries.md)."""

from fdlit.adversaries.attacks import (
                                       Attack,
                                       ConfidentWrong,
                                       FabricatedDensity,
                                       FreeRider,
                                       LabelFlipping,
                                       RandomPredictions,
                                       ScaledLogits,
                                       ScaledUpdate,
                                       SignFlippedUpdate,
)
from fdlit.adversaries.client_part import AdversarialClientPart
from fdlit.adversaries.section import Adversaries, Attackers

__all__ = ["AdversarialClientPart", "Adversaries", "Attack", "Attackers", "ConfidentWrong", "FabricatedDensity",
           "FreeRider", "LabelFlipping", "RandomPredictions", "ScaledLogits", "ScaledUpdate", "SignFlippedUpdate"]
