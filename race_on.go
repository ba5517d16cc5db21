//go:build race

package main

// raceEnabled: built with the race detector (quietconn_linux.go keeps to
// the standard reads and writes then; tests size their loads by it).
const raceEnabled = true
