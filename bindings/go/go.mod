module flashdec

go 1.19
