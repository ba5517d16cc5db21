module queued

go 1.26
