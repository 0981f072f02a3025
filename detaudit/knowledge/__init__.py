"""detaudit's knowledge base: which APIs seed, draw from or configure RNGs and
backends (``apis``), and which ops are nondeterministic (``ops``).  Data, read by
the static rules, the fixes, the runtime helpers and the dynamic report alike."""
