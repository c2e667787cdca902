"""dsh 0.2.1's checks of released v0 logs, which its v0→v1 edge runs on
every event: the inventory table (:mod:`.inventory`) of per-type steps,
messages (:mod:`.messages`), the records payloads carry (:mod:`.records`)
and the primitives (:mod:`.values`), each failing with dsh's text."""
