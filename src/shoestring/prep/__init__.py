"""`shoestring prep`: sources to a data dir (docs/data.md). The stages run here; what
train, eval, serve and retrieval read back is `shoestring.data`."""
