//! The numbers of a JSON document that `serde_json::Value` does not hold exactly: an integer
//! past `i64` and `u64`, or a decimal with more digits than an `f64` keeps. Two documents that
//! differ only in such a number read as the same `Value`; the content hash tells them apart by
//! these numbers' text ([`inexact`]).

use serde_json::Value;

/// The number literals of `document` (valid JSON, parsed as `parsed`) that `parsed` does not
/// hold exactly, as written, sorted: the same whatever order the document's keys come in. Such a
/// number is always held as an `f64`, so a document parsed without one is not read again.
pub(crate) fn inexact<'a>(parsed: &Value, document: &'a [u8]) -> Vec<&'a [u8]> {
    if !holds_float(parsed) {
        return Vec::new();
    }
    let mut found: Vec<&[u8]> = literals(document)
        .filter(|literal| !is_exact(literal))
        .collect();
    found.sort_unstable();
    found
}

/// Whether `value` holds a number as an `f64`.
fn holds_float(value: &Value) -> bool {
    match value {
        Value::Number(number) => number.is_f64(),
        Value::Array(items) => items.iter().any(holds_float),
        Value::Object(map) => map.values().any(holds_float),
        _ => false,
    }
}

/// Every number literal of `document` (valid JSON), in order: the runs of number characters
/// outside strings.
fn literals(document: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0;
    let mut in_string = false;
    std::iter::from_fn(move || {
        while at < document.len() {
            let byte = document[at];
            match (in_string, byte) {
                (true, b'\\') => at += 2,
                (true, b'"') | (false, b'"') => {
                    in_string = !in_string;
                    at += 1;
                }
                (false, b'-' | b'0'..=b'9') => {
                    let start = at;
                    while at < document.len() && is_number_byte(document[at]) {
                        at += 1;
                    }
                    return Some(&document[start..at]);
                }
                _ => at += 1,
            }
        }
        None
    })
}

fn is_number_byte(byte: u8) -> bool {
    matches!(byte, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
}

/// Whether `serde_json` holds `literal` exactly: an integer that fits `i64` or `u64`, or a
/// decimal whose `f64`, written back in its shortest form, is the same number.
fn is_exact(literal: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(literal) else {
        return false;
    };
    if !text.contains(['.', 'e', 'E']) {
        return text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok();
    }
    let Ok(value) = text.parse::<f64>() else {
        return false;
    };
    match serde_json::to_string(&value) {
        Ok(written) => decimal(text) == decimal(&written),
        Err(_) => false,
    }
}

/// A decimal literal as `(negative, significant digits, exponent)`, its value being the digits
/// times ten to the exponent; zero is `(false, "", 0)` whatever its sign. `None` if it is no
/// decimal.
fn decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    let mut exponent = exponent.checked_sub(i64::try_from(fraction.len()).ok()?)?;
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    exponent = exponent.checked_add(i64::try_from(digits.len() - significant.len()).ok()?)?;
    Some((negative, significant.to_owned(), exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(document: &str) -> Vec<&str> {
        let parsed: Value = serde_json::from_str(document).unwrap();
        let found = inexact(&parsed, document.as_bytes()).into_iter();
        found
            .map(|literal| std::str::from_utf8(literal).unwrap())
            .collect()
    }

    #[test]
    fn numbers_a_value_holds_exactly_are_not_listed() {
        let document = r#"{"a": 1, "b": -9223372036854775808, "c": 18446744073709551615,
            "d": 1.5, "e": 1.50, "f": 0.1, "g": 1e2, "h": -0.0, "i": 2.5e-7, "j": [0, 100.0]}"#;
        assert_eq!(found(document), Vec::<&str>::new());
    }

    #[test]
    fn integers_past_64_bits_and_overlong_decimals_are_listed_sorted() {
        let document =
            r#"{"b": 0.1000000000000000001, "a": [18446744073709551616, -9223372036854775809]}"#;
        assert_eq!(
            found(document),
            [
                "-9223372036854775809",
                "0.1000000000000000001",
                "18446744073709551616"
            ]
        );
    }

    #[test]
    fn digits_inside_strings_are_no_numbers() {
        let document = r#"{"id": "18446744073709551616", "quoted": "a \"99999999999999999999\" b", "rate": 1.5}"#;
        assert_eq!(found(document), Vec::<&str>::new());
    }

    #[test]
    fn a_decimal_is_read_as_its_significant_digits_and_exponent() {
        assert_eq!(decimal("1.50"), Some((false, "15".to_owned(), -1)));
        assert_eq!(decimal("-1500e-2"), Some((true, "15".to_owned(), 0)));
        assert_eq!(decimal("0.00"), Some((false, String::new(), 0)));
        assert_eq!(decimal("-0.0"), decimal("0"));
    }
}
