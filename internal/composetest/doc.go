// Package composetest holds the test that keeps docker-compose.yml and the
// Dockerfile honest without a Docker engine: the compose file is loaded and
// validated with compose-go, and every variable a bridge service sets is
// checked against the variables internal/config and internal/tracing read
// (and loaded through them, so a malformed value fails here, not in a
// container).
package composetest
