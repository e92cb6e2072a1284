//! Dependency-free SVG plots for reports (readable on GitHub): grouped bars and line charts.

/// A grouped bar chart: one group per category, one bar per series (values in points).
pub fn bar_svg(title: &str, categories: &[String], series: &[(String, Vec<f64>)]) -> String {
    let colours = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"];
    let (w, h, left, bottom, top) = (760.0, 320.0, 50.0, 40.0, 40.0);
    let plot_h = h - bottom - top;
    let group_w = (w - left - 20.0) / categories.len().max(1) as f64;
    let bar_w = group_w * 0.8 / series.len().max(1) as f64;
    let max = series.iter().flat_map(|s| s.1.iter()).copied().filter(|x| x.is_finite()).fold(1.0, f64::max);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11"><text x="{}" y="18" font-size="14" text-anchor="middle">{title}</text>"#,
        w / 2.0
    );
    for t in 0..=4 {
        let v = max * t as f64 / 4.0;
        let y = top + plot_h * (1.0 - t as f64 / 4.0);
        s += &format!(
            r##"<line x1="{left}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{v:.0}</text>"##,
            w - 20.0,
            left - 4.0,
            y + 4.0
        );
    }
    for (ci, c) in categories.iter().enumerate() {
        let gx = left + group_w * ci as f64 + group_w * 0.1;
        for (si, (_, vals)) in series.iter().enumerate() {
            let v = vals.get(ci).copied().unwrap_or(f64::NAN);
            if !v.is_finite() {
                continue;
            }
            let bh = plot_h * v / max;
            s += &format!(
                r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{v:.1}</title></rect>"#,
                gx + bar_w * si as f64,
                top + plot_h - bh,
                bar_w * 0.95,
                bh,
                colours[si % colours.len()]
            );
        }
        s += &format!(
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{c}</text>"#,
            gx + group_w * 0.4,
            h - bottom + 16.0
        );
    }
    for (si, (name, _)) in series.iter().enumerate() {
        let x = left + 10.0 + 150.0 * (si % 4) as f64;
        let y = h - 8.0 - 14.0 * (si / 4) as f64;
        s += &format!(
            r#"<rect x="{x}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{y}">{name}</text>"#,
            y - 9.0,
            colours[si % colours.len()],
            x + 14.0
        );
    }
    s + "</svg>"
}

/// Line chart of several series over steps (one panel), with min/max y labels.
pub fn line_svg(title: &str, series: &[(String, Vec<(f64, f64)>)]) -> String {
    let colours = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"];
    let (w, h, left, bottom, top) = (520.0, 260.0, 60.0, 50.0, 30.0);
    let pts: Vec<(f64, f64)> = series.iter().flat_map(|s| s.1.iter().copied()).filter(|p| p.1.is_finite()).collect();
    let (x0, x1) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let (y0, y1) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, p| (a.0.min(p.1), a.1.max(p.1)));
    let (x0, x1) = if x1 > x0 { (x0, x1) } else { (x0 - 1.0, x0 + 1.0) };
    let (y0, y1) = if y1 > y0 { (y0, y1) } else { (y0 - 1.0, y0 + 1.0) };
    let px = |x: f64| left + (w - left - 20.0) * (x - x0) / (x1 - x0);
    let py = |y: f64| top + (h - top - bottom) * (1.0 - (y - y0) / (y1 - y0));
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11"><text x="{}" y="18" font-size="13" text-anchor="middle">{title}</text><rect x="{left}" y="{top}" width="{}" height="{}" fill="none" stroke="#ccc"/><text x="{}" y="{}" text-anchor="end">{y1:.3}</text><text x="{}" y="{}" text-anchor="end">{y0:.3}</text><text x="{left}" y="{}">{x0:.0}</text><text x="{}" y="{}" text-anchor="end">step {x1:.0}</text>"##,
        w / 2.0,
        w - left - 20.0,
        h - top - bottom,
        left - 4.0,
        top + 8.0,
        left - 4.0,
        h - bottom,
        h - bottom + 14.0,
        w - 20.0,
        h - bottom + 14.0
    );
    for (i, (name, v)) in series.iter().enumerate() {
        let path: Vec<String> =
            v.iter().filter(|p| p.1.is_finite()).map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1))).collect();
        let c = colours[i % colours.len()];
        s += &format!(r#"<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{}"/>"#, path.join(" "));
        s += &format!(r#"<text x="{}" y="{}" fill="{c}">{name}</text>"#, left + 120.0 * i as f64, h - 12.0);
    }
    s + "</svg>"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svgs_are_well_formed() {
        let b = bar_svg("t", &["a".into(), "b".into()], &[("s".into(), vec![1.0, f64::NAN])]);
        assert!(b.starts_with("<svg") && b.ends_with("</svg>") && b.matches("<rect").count() >= 2);
        let l = line_svg("t", &[("r".into(), vec![(0.0, 0.1), (1.0, 0.3)])]);
        assert!(l.contains("<polyline") && l.ends_with("</svg>"));
    }
}
