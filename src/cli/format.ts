/**
 * Plain-text formatting for the CLI's human output: aligned tables, byte sizes and
 * durations. No colours and no terminal width tricks, so output reads the same in a
 * terminal, a CI log and a pipe; every command that prints a table also has `--json`.
 */

/** Left-aligned columns separated by two spaces; the header row first. */
export function formatTable(
  header: readonly string[],
  rows: ReadonlyArray<readonly string[]>,
): string {
  const widths = header.map((title, column) =>
    Math.max(title.length, ...rows.map((row) => (row[column] ?? '').length)),
  );
  const line = (cells: readonly string[]): string =>
    cells
      .map((cell, column) =>
        column === cells.length - 1 ? cell : cell.padEnd(widths[column] ?? 0),
      )
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)].join('\n');
}

/** 1536 → "1.5 KiB". */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/** 93784 → "1d 2h 3m 4s"; leading zero units are left out. */
export function formatDuration(totalSec: number): string {
  const parts: string[] = [];
  let rest = Math.max(0, Math.floor(totalSec));
  for (const [unit, size] of [
    ['d', 86_400],
    ['h', 3600],
    ['m', 60],
  ] as const) {
    const count = Math.floor(rest / size);
    rest -= count * size;
    if (count > 0 || parts.length > 0) parts.push(`${count}${unit}`);
  }
  parts.push(`${rest}s`);
  return parts.join(' ');
}
