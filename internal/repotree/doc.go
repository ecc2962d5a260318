// Package repotree holds the checks on the repository's tracked files as a
// reader meets them: the tree says what the product is and does, in the
// present tense, and the history of how it was built stays in git. Its tests
// read `git ls-files` from the module root.
package repotree
