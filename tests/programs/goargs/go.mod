module goargs

go 1.19
