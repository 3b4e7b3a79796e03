"""Structured output: JSON schemas, regexes, GBNF and Lark grammars as token masks (llguidance).

    constraint = Constraint.from_response_format(request["response_format"])  # None: free text
    matcher = compile(constraint, model)      # per reply; GrammarError if it does not compile
    apply_mask(logits, matcher.mask())        # before sampling
    matcher.consume([token])                  # after; rollback(n) undoes speculation
"""

from .engine import Matcher, VocabTokenizer, apply_mask, compile, tokenizer_for
from .spec import Constraint

__all__ = ["Constraint", "Matcher", "VocabTokenizer", "apply_mask", "compile", "tokenizer_for"]
