"""Assignment tests: public/ (shipped to students) and hidden/ (instructor only), run by the judge."""
