"""The embedding engine every model shares: the table (lookup, pooling, partitioning:
tables.py) and its sparse-aware updates (how a table's rows are updated: updates.py; the
update rules: optimizers.py)."""
