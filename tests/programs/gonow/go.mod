module gonow

go 1.19
