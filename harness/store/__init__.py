"""Storage, below everything else: dumps, goldens and capture trees are read and written only here.

atomic (every write), digest (MD5, XXH3-128), fast_hash (fast64), stats (tensor statistics), dump (one
xfalign dump), golden (a case's or a tree step's golden), tree_format and tree (a capture tree)."""
