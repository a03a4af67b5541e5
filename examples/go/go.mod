module flashdec-example

go 1.19

require flashdec v0.0.0

replace flashdec => ../../bindings/go
