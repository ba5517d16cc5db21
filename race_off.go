//go:build !race

package main

// raceEnabled: built with the race detector (see race_on.go).
const raceEnabled = false
