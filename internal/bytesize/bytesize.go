// Package bytesize prints byte counts for people. It is the one formatter
// of sizes in the module: the scheduler's reasons ("need 64.0 MiB") and the
// CLI's tables and progress lines print the same number the same way.
// Any package in the module may import it; it imports nothing of the
// module's own.
package bytesize

import "fmt"

// Format prints n in binary units with one decimal ("1.5 GiB"); counts
// under 1 KiB are printed whole ("512 B").
func Format(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
