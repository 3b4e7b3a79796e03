"""Proposers for the speculative loop (decoding/loop.py): one file per way of guessing."""

from .base import NoProposal, Proposal, Proposer
from .draft import Confidence, DraftProposer, FixedLength, VerifierRun
from .lookup import PromptLookup

__all__ = ["Confidence", "DraftProposer", "FixedLength", "NoProposal", "PromptLookup", "Proposal",
           "Proposer", "VerifierRun"]
