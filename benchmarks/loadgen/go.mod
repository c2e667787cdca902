module dsh-pipeline/loadgen

go 1.21
