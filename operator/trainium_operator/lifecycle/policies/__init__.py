"""The policies of a reconcile pass, one per module, each `(p: Pass) -> None`. Their order is
`lifecycle.machine.PIPELINE`, the one list every pass (and the dry run) runs."""
