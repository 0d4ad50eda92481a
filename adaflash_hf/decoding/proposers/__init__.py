"""Where draft tokens come from: one module per source behind :class:`~.base.LookupSource` (the row's own
text, earlier requests, the drafter's datastore) or batched (:class:`~.drafter.DrafterProposer`), and the
per-row merge of their candidates (:class:`~.hybrid.HybridProposer`)."""
