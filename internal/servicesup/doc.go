// Package servicesup tests scripts/services-up.sh's PostgreSQL decisions on
// the machine states a newcomer's machine can be in: PostgreSQL absent,
// installed with its cluster stopped, running and usable as it is, running
// and someone else's. The tests create their own clusters (unique names,
// free ports, a scratch state directory) and drop only those: a server the
// tests did not create is never started, stopped or changed.
package servicesup
