module chunkserve.dev/examples/shared-prefix

go 1.19

require chunkserve.dev/chunkserve v0.0.0

replace chunkserve.dev/chunkserve => ../../bindings/go
