package phalanx

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func statusErr() error { return status.Error(codes.Unavailable, "down") }
