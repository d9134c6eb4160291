//go:build race

package fault

// raceEnabled: the tests run with -race, so the binary under test is built
// with it too, and a race report in any process's log fails the test.
const raceEnabled = true
