"""The copy's states and moves (`PromptLookup`, prompt_lookup.py): the table, as data.

Between rounds the copy is in one of four states, read from its `Cursor`; within a round it is
copying (where the round's copy starts is found) and then offered (the proposal is with the
target). `Move` lists every transition: the states it may start from, what happens, the states
it may reach. `PromptLookup` takes a move at each change of state, and a move from a state
its row does not list, or to a state the cursor's fields do not show, fails (raised in the test
suite; elsewhere the loop gives the proposer up for the reply: the target's own steps, exact).
tests/test_copy_states.py drives every row with a token list, no model.

A round: `continue_copy` reads the target's token after the last round (`UNREAD` ... `NO_COPY`,
in `_start`), then cuts the proposal (`EMPTY` ... `PROPOSE`); `feedback` reads what the target
kept (`ACCEPTED`, `REFUSED`, `STAGED_READ`). Splice moves the copy twice more: where its draft
wrote and the source resumed, it offers the copy after the written tokens (`OFFER_AFTER_WRITING`),
and learns what they replaced once the target keeps them (`LEARN_DEPARTURE`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Final, NamedTuple


class State(Enum):
    """Where the copy stands: the first four between rounds, the last two within one."""

    NONE = "no copy yet"
    HELD = "held at `at`: the next round reads the target's token against the source's there"
    LOOSE = "stood at `at`, held nowhere: a match ending near it, or an anchor after it, goes on"
    DEPARTED = "departed: the reply left the copy at `departure` and has not come back"
    COPYING = "copying: where this round's copy starts is found"
    OFFERED = "offered: the round's copy (`Offer`) is with the target; `feedback` reads it"


NONE, HELD, LOOSE, DEPARTED, COPYING, OFFERED = State
RESTING = (NONE, LOOSE, DEPARTED)  # held nowhere: as the cursor's fields say (`Cursor.resting`)
STANDING = (HELD, DEPARTED)  # a copy that stands where it starts: held, or (projected) still departed


class Move(Enum):
    """Every transition of the copy: (the states it starts from, what happens, the states it
    may reach)."""

    def __init__(self, before: tuple[State, ...], event: str, after: tuple[State, ...]) -> None:
        self.before = frozenset(before)
        self.event = event
        self.after = frozenset(after)

    # ---- a round starts (`_start`): the target's token after the last round
    UNREAD = ((OFFERED,), "the last round's copy went unread (a grammar cut it to nothing or refused "
              "the tokens before it; the target refused splice's written tokens): it rests as it stood",
              RESTING)
    FOLLOW = ((HELD,), "the target's token is the source's at `at`: the copy goes on after it; "
              "`run` + 1", (COPYING,))
    RESUME = ((HELD,), "the target's token is the edit's next (`resume`): the copy goes on inside "
              "the edit; `run` + 1", (COPYING,))
    DEPART = ((HELD,), "any other token: departed at (`at`, the reply's last token)", (DEPARTED,))
    AT_END = ((HELD,), "`at` is the indexed text's last token: nothing to read the target's token "
              "against", (LOOSE,))
    RELAY = ((DEPARTED,), "the reply wrote the source again laid out otherwise (the same non-blank "
             "bytes): the copy goes on where the reply stands in it, byte by byte; where the two meet at "
             "a token boundary the gaps are learned and the departure moves there", (COPYING,))
    REFIND = ((DEPARTED,), "the reply, laying out anew, changed the text: its last non-blank bytes "
              "found near `at`; departed there, the copy goes on from there", (COPYING,))
    MATCH = (RESTING, "a match of the reply's last tokens (one ending near `at` first): the copy goes "
             "on from its end; what the reply wrote since a departure is learned as an edit", (COPYING,))
    ANCHOR = ((LOOSE, DEPARTED), "no match; the reply's last token (two where they agree) within "
              "`anchor_window` after `at`: the copy goes on from there (priced as an anchor); what the "
              "reply wrote since a departure is learned as an edit", (COPYING,))
    NO_COPY = (RESTING, "neither: no copy continues the reply (`continue_copy` answers NO_COPY: splice's "
               "draft may write)", RESTING)
    # ---- the proposal (`continue_copy`)
    EMPTY = ((COPYING,), "nothing to copy there (the text, the predicted output or the budget ends): "
             "a plain step; the copy rests as it stood, its hold dropped", RESTING)
    STAGED = ((COPYING,), "staged: the draft reads the span in one decode; what it agrees with, and "
              "its own token at the cut, proposed", (OFFERED,))
    HOMEWARD = ((COPYING,), "a copy of the reply's own text: two of its tokens meet the source just "
                "after `home`; the source goes on from there instead", (COPYING,))
    STOP_FIRST = ((COPYING,), "its first token is one the target refuses more often than it copies: a "
                  "plain step; the copy stands where it starts (a projected copy: still departed)", STANDING)
    UNPAID_LAID = ((COPYING,), "no length pays for a call, in a reply laying out anew: a plain step; "
                   "the copy stands where it starts (a projected copy: still departed)", STANDING)
    UNPAID = ((COPYING,), "no length pays for a call: a plain step; the copy rests as it stood, its "
              "hold dropped", RESTING)
    PROPOSE = ((COPYING,), "proposed up to where tokens per millisecond peak; the copy's token after "
               "it, where an edit wrote it, kept (`resume`)", (OFFERED,))
    # ---- splice (`offer_copy`, `learn_departure`)
    OFFER_AFTER_WRITING = ((LOOSE, DEPARTED), "splice's draft wrote where no copy went on, until the "
                           "source resumed: the copy from there offered after the written tokens "
                           "(anchored)", (OFFERED,))
    LEARN_DEPARTURE = ((OFFERED,), "the target kept splice's written tokens: what they replaced since "
                       "the departure is learned as an edit; the departure cleared", (OFFERED,))
    # ---- what the target kept (`feedback`)
    ACCEPTED = ((OFFERED,), "accepted whole: held at the source after the last token (departed inside "
                "a token where a laid-out copy ended inside one)", (HELD, DEPARTED))
    REFUSED = ((OFFERED,), "refused at token i: departed at the source after token i - 1 (where the "
               "copy started, i = 0), the target's token in its place", (DEPARTED,))
    STAGED_READ = ((OFFERED,), "a staged copy read: the draft's agreement stands in for the target's; "
                   "the copy rests after the agreed tokens, held nowhere", (LOOSE, DEPARTED))


class Departure(NamedTuple):
    """Where the reply left the copy."""

    at: int  # the source position of the token the reply did not copy
    reply: int  # where the reply's own tokens start
    skip: int = 0  # bytes of that source token the reply had written (a departure inside a token)


class Resume(NamedTuple):
    """The copy's token after a proposal, where an edit wrote it: if the target writes it, the
    copy goes on inside the edit."""

    token: int
    at: int  # where the edit's source tokens start
    written: int  # how many of the edit's written tokens the reply then holds


@dataclass
class Cursor:
    """Where the copy stands (`state`, changed only by `move`) and the fields its moves keep."""

    state: State = NONE
    moves: list[Move] = field(default_factory=list)  # the moves of the round so far
    at: int | None = None  # the source position the copy stands at (None: no copy yet)
    run: int = 0  # tokens the reply has followed the copy in a row (priced like a match as long)
    departure: Departure | None = None  # the reply left the copy here and has not come back
    home: int | None = None  # copying the reply's own text: where the copy stood in the source
    resume: Resume | None = None  # the copy's next token, where an edit wrote it

    @property
    def held(self) -> bool:
        """The copy stands at `at`: the next round reads the target's token against it."""
        return self.state is HELD

    def resting(self) -> State:
        """The state a copy held nowhere is in, as the fields say: departed, loose at `at`, or none."""
        return DEPARTED if self.departure is not None else NONE if self.at is None else LOOSE

    def move(self, move: Move, to: State | None = None) -> None:
        """Take `move` (its fields already changed): from `state`, which its row must list, to
        `to` (the row's one next state unless given), which the fields must show."""
        if to is None:
            (to,) = move.after
        shows = to in (COPYING, OFFERED) or (self.at is not None and self.departure is None if to is HELD
                                              else to is self.resting())
        if self.state not in move.before or to not in move.after or not shows:
            raise AssertionError(f"the copy's move {move.name} from {self.state.name} to {to.name} "
                                 f"(at {self.at}, departure {self.departure}) is not in its table")
        self.state = to
        self.moves.append(move)


class NoCopy(Enum):
    """`continue_copy`'s answer where no copy continues the reply (splice's draft may write
    there); an empty `Proposal` is a plain step the copy chose (it stands, or nothing pays)."""

    NO_COPY = "no copy continues the reply"


NO_COPY: Final = NoCopy.NO_COPY
