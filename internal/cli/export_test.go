package cli

// NewRootForTest builds the command tree `bridge` runs, for the black-box
// tests of package cli_test.
var NewRootForTest = newRoot
