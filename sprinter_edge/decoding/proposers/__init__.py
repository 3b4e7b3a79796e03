"""Proposers for the speculative loop (decoding/loop.py): one file per way of guessing."""

from .base import NoProposal, Proposal, Proposer
from .draft import DraftProposer, FixedLength, MinProb, VerifierRun
from .prompt_lookup import PromptLookup

__all__ = ["DraftProposer", "FixedLength", "MinProb", "NoProposal", "PromptLookup", "Proposal",
           "Proposer", "VerifierRun"]
