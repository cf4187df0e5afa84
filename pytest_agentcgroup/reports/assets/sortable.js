// Sortable tables, no dependencies: click (or Enter on) a header of a table.sortable to sort its
// rows by that column; again to reverse. Numeric columns (th[data-type=number]) sort by the cell's
// data-value; empty cells always go last.
"use strict";
function sortTable(table, col) {
  const heads = table.tHead.rows[0].cells;
  const th = heads[col];
  const ascending = th.getAttribute("aria-sort") !== "ascending";
  for (const h of heads) h.removeAttribute("aria-sort");
  th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  const numeric = th.dataset.type === "number";
  const key = (row) => {
    const cell = row.cells[col];
    const raw = cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent.trim();
    if (raw === "") return null;
    return numeric ? parseFloat(raw) : raw;
  };
  const body = table.tBodies[0];
  const rows = Array.from(body.rows).map((row) => [key(row), row]);
  rows.sort(([a], [b]) => {
    if (a === null || b === null) return (a === null) - (b === null);
    const c = numeric ? a - b : a.localeCompare(b, undefined, {numeric: true});
    return ascending ? c : -c;
  });
  for (const [, row] of rows) body.appendChild(row);
}
document.querySelectorAll("table.sortable").forEach((table) => {
  Array.from(table.tHead.rows[0].cells).forEach((th, col) => {
    th.tabIndex = 0;
    th.title = (th.title ? th.title + " — " : "") + "click to sort";
    th.addEventListener("click", () => sortTable(table, col));
    th.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortTable(table, col); }
    });
  });
});
