module gochain

go 1.19
