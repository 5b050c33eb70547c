// Typeset only the math that pymdownx.arithmatex (generic mode) marked up.
window.MathJax = {
  tex: { inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]] },
  options: { ignoreHtmlClass: ".*", processHtmlClass: "arithmatex" },
};
