"""Which draft sources the engine may use each round (:class:`DraftingConfig`) and the names of the sources."""

from __future__ import annotations

from dataclasses import dataclass, field

SOURCES = ("drafter", "suffix", "global", "datastore")
NONE = "none"
TREE = "tree"  # the source of a proposal whose tree merges candidates of several sources


@dataclass
class DraftingConfig:
    """Which draft sources the engine may use each round, and how far suffix matches reach."""

    drafter: bool = field(default=True, metadata={"help": "Use the learned drafter's block (needs a drafter)."})
    suffix: bool = field(
        default=True, metadata={"help": "Use continuations of the row's own prompt and output (suffix match)."}
    )
    global_index: bool = field(
        default=True, metadata={"help": "Use continuations from earlier requests of this process."}
    )
    datastore: bool = field(
        default=True,
        metadata={
            "help": "Use continuations from the drafter's datastore of the target's own outputs, when it ships one."
        },
    )
    max_ngram: int = field(default=4, metadata={"help": "Longest n-gram matched against the history (backs off to 1)."})
    max_suffix_tokens: int = field(default=16, metadata={"help": "Longest continuation a suffix match proposes."})
    global_max_tokens: int = field(
        default=262_144, metadata={"help": "Tokens the global index keeps (oldest requests are evicted first)."}
    )
    tree_nodes: int = field(
        default=16,
        metadata={
            "help": "Most draft tokens a row verifies per round as a tree that merges its candidates (the batched "
            "engine); 0 verifies the single best candidate."
        },
    )
    branches: int = field(
        default=3,
        metadata={
            "help": "Continuations each suffix index offers to the tree: the most frequent, then the runner-up next "
            "tokens."
        },
    )
    drafter_scores: bool = field(
        default=True,
        metadata={
            "help": "Where a drafter pass is cheap (at most a tenth of a plain step, measured), run it every round "
            "and add its probability of each look-up token to that token's acceptance feature, so the tree spends its "
            "nodes on candidates the drafter also finds likely."
        },
    )
    drafter_every_round: bool = field(
        default=False,
        metadata={
            "help": "Run the drafter every round, also where its recent acceptance says it would not pay (the engine "
            "otherwise skips it then, trying it every few rounds): how a drafter's own tau is measured."
        },
    )

    def __post_init__(self) -> None:
        if self.max_ngram < 1 or self.max_suffix_tokens < 1 or self.global_max_tokens < 1:
            raise ValueError(
                f"max_ngram ({self.max_ngram}), max_suffix_tokens ({self.max_suffix_tokens}) and global_max_tokens "
                f"({self.global_max_tokens}) must all be >= 1."
            )
        if self.tree_nodes < 0 or self.branches < 1:
            raise ValueError(f"tree_nodes ({self.tree_nodes}) must be >= 0 and branches ({self.branches}) >= 1.")
        if not (self.drafter or self.suffix or self.global_index or self.datastore):
            raise ValueError(
                "DraftingConfig switches every source off; enable at least one of drafter, suffix, global_index, "
                "datastore."
            )

    @classmethod
    def from_sources(cls, sources: str, tree_nodes: int | None = None) -> DraftingConfig:
        """A config from a comma-separated subset of ``drafter,suffix,global,datastore`` (the CLI's ``--sources``)
        and, unless None, a draft-tree size (``--tree-nodes``)."""
        chosen = {s.strip() for s in sources.split(",") if s.strip()}
        if not chosen or chosen - set(SOURCES):
            raise ValueError(f"--sources {sources!r}: choose one or more of {', '.join(SOURCES)}.")
        if tree_nodes is not None and tree_nodes < 0:
            raise ValueError(f"--tree-nodes {tree_nodes}: must be >= 0 (0 verifies one candidate per round).")
        tree = {} if tree_nodes is None else {"tree_nodes": tree_nodes}
        return cls(
            drafter="drafter" in chosen,
            suffix="suffix" in chosen,
            global_index="global" in chosen,
            datastore="datastore" in chosen,
            **tree,
        )

    @classmethod
    def only(cls, source: str) -> DraftingConfig:
        """A config with one source switched on (``drafter``, ``suffix``, ``global`` or ``datastore``)."""
        if source not in SOURCES:
            raise ValueError(f"unknown draft source {source!r}; choose from {', '.join(SOURCES)}.")
        return cls(
            drafter=source == "drafter",
            suffix=source == "suffix",
            global_index=source == "global",
            datastore=source == "datastore",
        )
