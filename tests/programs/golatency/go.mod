module golatency

go 1.19
