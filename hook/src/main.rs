//! `nri-gpu-hook start-container ...`: see the library's documentation (`cli`).

fn main() {
    let mut words = Vec::new();
    for word in std::env::args_os().skip(1) {
        match word.into_string() {
            Ok(word) => words.push(word),
            Err(word) => {
                eprintln!("nri-gpu-hook: error: an argument is not UTF-8: {:?}", word);
                std::process::exit(2);
            }
        }
    }
    std::process::exit(nri_gpu_hook::cli::main_with(&words));
}
