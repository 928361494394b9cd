// Package gosdksuite only pins the SDK (and, through go.sum, its test dependencies): the tests
// run are the SDK's own, `go test github.com/firecracker-microvm/firecracker-go-sdk`.
package gosdksuite

import _ "github.com/firecracker-microvm/firecracker-go-sdk"
