package opsserver

import "net/http"

// StatusRecorder remembers the status a handler answered with, so the admin
// API and the console can log each change request with its outcome after the
// handler has run.
type StatusRecorder struct {
	http.ResponseWriter
	Status int
}

func (s *StatusRecorder) WriteHeader(status int) {
	if s.Status == 0 {
		s.Status = status
	}
	s.ResponseWriter.WriteHeader(status)
}

func (s *StatusRecorder) Write(b []byte) (int, error) {
	if s.Status == 0 {
		s.Status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}
