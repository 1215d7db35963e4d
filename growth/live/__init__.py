"""Growth inside a running DeepSpeed job: ``grow`` (grow_engine: build the grown engine, transfer, free the old
one), ``transfer`` (EngineStore and the bucketed transfer of every parameter and both Adam moments), ``shards``
(each rank's fragments of the ZeRO-1/2/3 flat partitions)."""
