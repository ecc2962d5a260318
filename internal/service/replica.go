package service

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// ReplicaID returns a new id for this replica: "host/pid/random". Host and
// pid tell an operator which process holds a lease or a claim; the random
// part keeps a restarted process (same host, a reused pid in a container)
// from being taken for its predecessor, whose leases must expire, not be
// inherited.
func ReplicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
